"""Throughput and latency of the hardened verifier (hacrl.verify) on a realistic mix of responses.

    python scripts/bench_verifier.py [--n 2000] [--workers 2] [--timeout 3] [--adversarial 0.05]

Builds responses that are correct (often in another form than the reference), wrong, malformed
(no box, truncated box) or adversarial (huge powers, deep nesting, megabyte text, Python
payloads), grades them in RL-sized batches, and prints responses per second, how items were
decided (fast path, math-verify, timeouts) and the worst per-item latency seen by the pool
(dispatch to result). Prints figures only; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

from hacrl.verify import Verifier

# (reference, equivalent forms a model might write, plausible wrong answers)
PROBLEMS: list[tuple[str, list[str], list[str]]] = [
    ("42", ["42", "42.0", "x = 42"], ["41", "-42", "24"]),
    ("1000", ["1,000", "1000", "10^3"], ["100", "1,001"]),
    ("\\frac{1}{2}", ["0.5", "\\dfrac{1}{2}", "1/2", "\\frac12"], ["\\frac{1}{3}", "2"]),
    ("\\frac{3}{4}", ["0.75", "\\tfrac{3}{4}", "\\frac{6}{8}"], ["\\frac{4}{3}", "0.7"]),
    ("2\\sqrt{3}", ["\\sqrt{12}", "2\\sqrt3"], ["\\sqrt{6}", "3\\sqrt{2}"]),
    ("\\frac{\\sqrt{2}}{2}", ["\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}"], ["\\sqrt{2}", "\\frac{1}{2}"]),
    ("(1,2]", ["(1, 2]", "\\left(1,2\\right]"], ["[1,2]", "(1,2)"]),
    ("(-\\infty, 3)", ["(-\\infty,3)", "(-\\infty , 3)"], ["(-\\infty,3]", "(3,\\infty)"]),
    ("(1,2)", ["(1, 2)"], ["(2,1)", "(1,3)"]),
    ("\\{1,2\\}", ["\\{2,1\\}", "\\{1, 2\\}"], ["\\{1,3\\}"]),
    ("x^2+2x+1", ["(x+1)^2", "x^2 + 2x + 1"], ["x^2+1", "(x-1)^2"]),
    ("90", ["90^\\circ", "90^{\\circ}"], ["45", "180"]),
    ("10", ["10\\text{ cm}", "10 \\text{cm}"], ["100", "1"]),
    ("\\pi", ["\\pi"], ["2\\pi", "3.14"]),
    ("3", ["\\log_2 8", "\\sqrt{9}"], ["\\log_2 9", "2"]),
    ("\\text{(C)}", ["C", "\\text{C}"], ["B", "\\text{(D)}"]),
]

ADVERSARIAL = [
    "\\boxed{2^{10^{100}}}",
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{10^{10^{10}}!}",
    "\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}",
    "\\boxed{" + "{" * 300 + "x" + "}" * 300 + "}",
    "blah " * 200_000,
    "blah " * 200_000 + "\\boxed{7}",
    "\\boxed{\\frac{1}{",
    "\\boxed{\\left(1,2}",
    "\\boxed{½}",
    "\\boxed{😀\x00\ud800}",
    "\\boxed{__import__('os').system('touch /tmp/PWNED')}",
    "The answer is open('pwned.txt','w').write('x')",
    "\\boxed{(lambda: exec(\"open('pwned.txt','w')\"))()}",
]

FILLER = ("Let me work through this step by step. First we simplify the expression, then we "
          "substitute the values and check the boundary cases. ")


def build_mix(n: int, adversarial: float, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """(responses, references, kinds), with kinds in correct/wrong/malformed/adversarial."""
    rng = random.Random(seed)
    responses, references, kinds = [], [], []
    for _ in range(n):
        gold, same, wrong = rng.choice(PROBLEMS)
        body = FILLER * rng.randint(1, 8)
        u = rng.random()
        if u < adversarial:
            kind, text = "adversarial", rng.choice(ADVERSARIAL)
        elif u < adversarial + 0.45:
            kind, text = "correct", body + f"Therefore the answer is $\\boxed{{{rng.choice(same)}}}$."
        elif u < adversarial + 0.85:
            kind, text = "wrong", body + f"So we get \\boxed{{{rng.choice(wrong)}}}."
        else:
            kind = "malformed"
            text = body + rng.choice([
                "I am not sure.", f"\\boxed{{{rng.choice(same)}", "The answer is",
                f"The final answer is {rng.choice(same + wrong)}.", "\\boxed{}"])
        responses.append(text)
        references.append(gold)
        kinds.append(kind)
    return responses, references, kinds


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Run the benchmark, print the figures and return them."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="responses in total")
    ap.add_argument("--batch", type=int, default=256, help="responses per grade_many call")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3.0, help="seconds per response")
    ap.add_argument("--adversarial", type=float, default=0.05, help="share of adversarial items")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    responses, references, kinds = build_mix(args.n, args.adversarial, args.seed)
    with Verifier(timeout_s=args.timeout, workers=args.workers) as verifier:
        start = time.perf_counter()
        verifier.rewards(["\\boxed{x+1}"] * args.workers, ["1+x"] * args.workers)
        startup = time.perf_counter() - start
        verifier.stats.clear()

        worst, batch_worst, correct = 0.0, 0.0, {k: [0, 0] for k in set(kinds)}
        start = time.perf_counter()
        for lo in range(0, args.n, args.batch):
            t0 = time.perf_counter()
            grades = verifier.grade_many(responses[lo:lo + args.batch],
                                         references[lo:lo + args.batch])
            batch_worst = max(batch_worst, time.perf_counter() - t0)
            worst = max([worst] + [o.latency_s for o in verifier.pool.last_outcomes])
            for g, k in zip(grades, kinds[lo:lo + args.batch], strict=True):
                correct[k][0] += g.correct
                correct[k][1] += 1
        elapsed = time.perf_counter() - start
        stats = dict(verifier.stats)
        pool_stats = dict(verifier.pool.stats)

    n = args.n
    share = {k: stats.get(k, 0) / n for k in ("fast_path", "math_verify", "long", "no_answer")}
    print(f"{n} responses, workers={args.workers}, timeout={args.timeout:g} s, "
          f"batch={args.batch}, adversarial share={args.adversarial:g}")
    print(f"worker start-up (not timed below): {startup:.2f} s")
    print(f"throughput: {n / elapsed:.0f} responses/s ({elapsed:.2f} s)")
    print("decided by: " + ", ".join(f"{k} {v:.1%}" for k, v in share.items()))
    print(f"math-verify tasks: {pool_stats['items']} (after de-duplication), timeouts "
          f"{pool_stats['timeouts']}, worker restarts {pool_stats['restarts']}, unsafe "
          f"{pool_stats['unsafe']}, errors {pool_stats['errors']}")
    print(f"worst per-item latency (dispatch to result): {worst:.2f} s; "
          f"slowest batch of {args.batch}: {batch_worst:.2f} s")
    print("accepted by kind: " + ", ".join(f"{k} {c}/{t}" for k, (c, t) in sorted(correct.items())))
    return {"responses_per_s": n / elapsed, "worst_latency_s": worst, **share,
            "timeouts": float(pool_stats["timeouts"])}


if __name__ == "__main__":
    main()
