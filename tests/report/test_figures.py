import io

import numpy as np

from docclass.report.figures import confusion_matrix_figure


def test_class_names_with_dollar_signs_are_drawn_as_written():
    # Between two dollar signs matplotlib reads math: "costs $5-$10" became "costs 5 − 10",
    # and an unknown command made saving the figure fail.
    names = ["costs $5-$10", r"$\money$ talk", "plain"]
    figure = confusion_matrix_figure(np.array([[3, 1, 0], [0, 2, 1], [1, 0, 4]]), names)
    figure.savefig(io.BytesIO(), format="png")
    for ticks in (figure.axes[0].get_xticklabels(), figure.axes[0].get_yticklabels()):
        assert [tick.get_text() for tick in ticks] == names
        assert not any(tick.get_parse_math() for tick in ticks)
