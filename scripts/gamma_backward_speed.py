"""A linear layer's forward and LRP-γ backward pass at MiniLM's layer sizes, the shipped form
beside the five-product one it replaced and beside LRP-0's plain backward pass, in
interleaved rounds: `make gamma-speed`.

The five-product form writes the positive and negative weights out (two products twice as
wide, and the plain one); the shipped form takes the same sums from one product with |W|
beside the plain one. Prints the figures and writes them as JSON, with the largest difference
between the two forms' gradients.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from docclass.nn import relevance
from docclass.train.callbacks import machine_summary

# MiniLM's linear layers: queries, keys, values and the attention output; then the FFN's two.
SHAPES = ((384, 384), (384, 1536), (1536, 384))


class _FiveProductGamma(torch.autograd.Function):
    """The form before: the same rule, the positive and negative weights written out."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # noqa: D102
        y = F.linear(x, weight, bias)
        ctx.save_for_backward(x, weight, bias, y)
        return y

    @staticmethod
    def backward(ctx, gradient):  # noqa: D102
        x, weight, bias, y = ctx.saved_tensors
        gamma = relevance.GAMMA
        positive_weight, negative_weight = weight.clamp(min=0), weight.clamp(max=0)
        signed_weights = torch.cat([positive_weight, negative_weight], dim=1)
        positive = F.linear(torch.cat([x.clamp(min=0), x.clamp(max=0)], dim=-1), signed_weights)
        negative = (y - bias) - positive
        rising = y >= 0
        denominator = y + gamma * torch.where(rising, positive, negative)
        denominator = denominator + torch.where(
            denominator >= 0, relevance.STABILISER, -relevance.STABILISER
        )
        share = gradient * y / denominator
        plain = share @ weight
        matched = torch.cat([share * rising, share * ~rising], dim=-1) @ torch.cat(
            [positive_weight, negative_weight], dim=0
        )
        x_gradient = plain + gamma * torch.where(x > 0, matched, 0.0)
        x_gradient = x_gradient + gamma * torch.where(x < 0, plain - matched, 0.0)
        return x_gradient, None, share.flatten(0, -2).sum(0)


FORMS = ("shipped", "five products", "LRP-0")


def _input_gradient(form: str, x, layer, gradient) -> torch.Tensor:
    x = x.detach().requires_grad_(True)
    if form == "shipped":
        y = relevance.linear(x, layer, "cp-gamma")
    elif form == "five products":
        y = _FiveProductGamma.apply(x, layer.weight.detach(), layer.bias)
    else:  # LRP-0: the plain gradient, what every other rule's linear layers take
        y = relevance.linear(x, layer, "cp")
    (x_gradient,) = torch.autograd.grad(y, x, gradient)
    return x_gradient


def measure(tokens: int, rounds: int) -> list[dict]:
    torch.manual_seed(0)
    rows = []
    for inputs, outputs in SHAPES:
        layer = torch.nn.Linear(inputs, outputs)
        x, gradient = torch.randn(tokens, inputs), torch.randn(tokens, outputs)
        shipped = _input_gradient("shipped", x, layer, gradient)
        before = _input_gradient("five products", x, layer, gradient)
        _input_gradient("LRP-0", x, layer, gradient)  # each form warmed up once
        difference = float((shipped - before).abs().max() / before.abs().max())
        if difference > 1e-5:
            raise RuntimeError(f"the two forms of LRP-γ differ by {difference:.1e}")
        seconds = {form: [] for form in FORMS}
        for turn in range(rounds):  # interleaved, each form first in turn
            for form in FORMS[turn % 3 :] + FORMS[: turn % 3]:
                started = time.perf_counter()
                _input_gradient(form, x, layer, gradient)
                seconds[form].append(time.perf_counter() - started)
        shipped_s = statistics.median(seconds["shipped"])
        before_s = statistics.median(seconds["five products"])
        plain_s = statistics.median(seconds["LRP-0"])
        rows.append(
            {
                "shape": [inputs, outputs],
                "tokens": tokens,
                "median_shipped_s": round(shipped_s, 4),
                "median_five_products_s": round(before_s, 4),
                "median_lrp0_s": round(plain_s, 4),
                "speed_up": round(before_s / shipped_s, 2),
                "cost_over_lrp0": round(shipped_s / plain_s, 2),
                "largest_difference": difference,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="reports/gamma-backward-speed.json")
    args = parser.parse_args()
    rows = measure(args.tokens, args.rounds)
    figures = {
        "gamma": relevance.GAMMA,
        "rounds": args.rounds,
        "layers": rows,
        "machine": machine_summary(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2))
    for row in rows:
        print(
            f"{row['shape'][0]}→{row['shape'][1]}, {row['tokens']} tokens: forward + LRP-γ "
            f"backward {row['median_shipped_s']} s against {row['median_five_products_s']} s "
            f"({row['speed_up']}×; LRP-0 {row['median_lrp0_s']} s, γ costs "
            f"{row['cost_over_lrp0']}× it), gradients differ by "
            f"{row['largest_difference']:.1e} of the largest"
        )
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
