import io
import itertools
import json

import numpy as np

from docclass.report.figures import confusion_matrix_figure
from docclass.report.html import _metric_log


def test_class_names_with_dollar_signs_are_drawn_as_written():
    # Between two dollar signs matplotlib reads math: "costs $5-$10" became "costs 5 − 10",
    # and an unknown command made saving the figure fail.
    names = ["costs $5-$10", r"$\money$ talk", "plain"]
    figure = confusion_matrix_figure(np.array([[3, 1, 0], [0, 2, 1], [1, 0, 4]]), names)
    figure.savefig(io.BytesIO(), format="png")
    for ticks in (figure.axes[0].get_xticklabels(), figure.axes[0].get_yticklabels()):
        assert [tick.get_text() for tick in ticks] == names
        assert not any(tick.get_parse_math() for tick in ticks)


def test_the_training_curves_come_from_the_fit_metrics_json_names(tmp_path):
    # `docclass test` in a run folder starts logs/version_1 with test figures only; the page
    # drew its two empty plots because it took the newest log.
    run = tmp_path / "run"
    for version, header in ((0, "step,train/loss_step,val/acc"), (1, "step,test/acc")):
        (run / "logs" / f"version_{version}").mkdir(parents=True)
        (run / "logs" / f"version_{version}" / "metrics.csv").write_text(header + "\n0,1,0.5\n")
    # The fit named its log by the path it was run with; the folder has moved since.
    named = "/elsewhere/run/logs/version_0/metrics.csv"
    (run / "metrics.json").write_text(json.dumps({"metric_log": named}))
    assert _metric_log(run) == run / "logs" / "version_0" / "metrics.csv"
    (run / "metrics.json").write_text(json.dumps({"metric_log": None}))
    assert _metric_log(run) is None


def test_the_reliability_bar_of_sure_documents_stands_apart_and_is_seen():
    """Documents whose top probability is exactly 1 are a bin of their own (low == high):
    drawn over the last bin's bar it hid it; alone, it took a zero width and no bar showed."""
    import torch

    from docclass.calibration import reliability_bins
    from docclass.report.figures import reliability_figure

    sure = torch.tensor([[1.0, 0.0]] * 3)
    mixed = torch.cat([sure, torch.tensor([[0.95, 0.05]] * 4)])
    for probs in (sure, mixed):
        bins = reliability_bins(probs, torch.zeros(len(probs), dtype=torch.long))
        figure = reliability_figure(
            {"reliability": {"before": bins, "after": bins}, "before": {"ece": 0.0},
             "after": {"ece": 0.0}}, 1.0,
        )  # fmt: skip
        bars = sorted(
            (patch.get_x(), patch.get_x() + patch.get_width()) for patch in figure.axes[0].patches
        )
        assert len(bars) == len(bins) and all(right > left for left, right in bars)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(bars)), bars  # none over another
        assert figure.axes[0].get_xlim()[1] >= bars[-1][1]


def test_the_calibration_figures_name_their_documents_and_an_unfitted_temperature():
    """Drawn on the run's split, whatever documents the report's pages show: the figures
    say which, and with no temperature fitted the second panel does not claim one."""
    import torch

    from docclass.calibration import reliability_bins
    from docclass.report.figures import reliability_figure, risk_coverage_figure

    bins = reliability_bins(torch.tensor([[0.9, 0.1]] * 4), torch.zeros(4, dtype=torch.long))
    split = {"reliability": {"before": bins, "after": bins}, "before": {"ece": 0.1},
             "after": {"ece": 0.1}}  # fmt: skip
    unfitted = reliability_figure(split, 1.0, "the run's test split (4 documents)")
    assert unfitted.texts[0].get_text() == "the run's test split (4 documents)"
    assert unfitted.axes[1].get_title() == "no temperature fitted: ECE 0.100"
    assert reliability_figure(split, 0.5).axes[1].get_title() == "calibrated (T = 0.500): ECE 0.100"
    curve = [{"coverage": 0.5, "risk": 0.0}, {"coverage": 1.0, "risk": 0.1}]
    drawn = risk_coverage_figure(curve, {}, "the run's test split (4 documents)")
    assert drawn.axes[0].get_title() == "the run's test split (4 documents)"
