"""The page's default method follows its own faithfulness table."""

from docclass.interpret.default_method import default_method


def row(comprehensiveness, sufficiency):
    return {"comprehensiveness": comprehensiveness, "sufficiency": sufficiency}


RANDOM = row(0.02, 0.40)


def test_highest_comprehensiveness_among_methods_sufficient_beyond_random():
    table = {
        "random": RANDOM,
        # The most comprehensive, but its top words alone convince less than random words.
        "grad_input": row(0.30, 0.45),
        "contribution": row(0.25, 0.20),
        "attention": row(0.10, 0.30),
        "attention_head0": row(0.50, 0.01),  # one head is not a method
    }
    chosen = default_method(table, documents=213)
    assert chosen.method == "contribution"
    assert "0.250" in chosen.reason and "12.5× random's" in chosen.reason
    assert "213 documents" in chosen.reason
    assert "not above random's" not in chosen.reason


def test_a_method_no_more_comprehensive_than_random_is_shown_with_a_plain_warning():
    """Sufficient beyond random, but removing its top words does no more than removing random
    ones: chosen by the rule, and the reason must say its scores are no reasons."""
    for comprehensiveness in (0.01, 0.02, 0.024):  # below, at, and within TIE of random's
        table = {"random": RANDOM, "contribution": row(comprehensiveness, 0.2)}
        chosen = default_method(table, documents=50)
        assert chosen.method == "contribution"
        assert "not above random's (0.020)" in chosen.reason, comprehensiveness
        assert "do not read its scores as the reasons" in chosen.reason


def test_a_tie_goes_to_the_cheaper_method():
    table = {"random": RANDOM, "rollout": row(0.253, 0.2), "contribution": row(0.25, 0.2)}
    chosen = default_method(table)
    assert chosen.method == "contribution" and "tied with attention rollout" in chosen.reason


def test_without_a_sufficient_method_the_most_comprehensive_with_a_warning():
    table = {"random": RANDOM, "attention": row(0.05, 0.5), "grad_input": row(0.2, 0.6)}
    chosen = default_method(table)
    assert chosen.method == "grad_input" and "trust it less" in chosen.reason


def test_unmeasured_report_says_so():
    chosen = default_method(None)
    assert chosen.method == "conservative" and "not measured" in chosen.reason
