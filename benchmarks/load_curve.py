"""Print the simulator's load model next to the published load curves it is calibrated on.

    .venv/bin/python benchmarks/load_curve.py

For each target: the best arm's speedup over no speculation (averaged over
its datasets) at each concurrency, and where fixed long K drops below 1.
"""

from __future__ import annotations

import numpy as np

from specctl.sim.table import LOAD_SLOPE, REFERENCE_BATCH, build_target, read_rows, targets

BATCHES = (1, 4, 8, 32, 64, 128, 256, 512)
# DeepSeek-V3 MTP on 8x MI300X (SGLang): concurrency -> speedup
PUBLISHED = {1: 2.11, 8: 1.70, 32: 1.44, 64: 1.25}


def main() -> None:
    print(f"load model: g(B) = 1 + {LOAD_SLOPE} * (sqrt(B) - 1), table at B = {REFERENCE_BATCH}")
    mal = 2.7
    c1 = mal / PUBLISHED[1]
    print("DeepSeek-V3 MTP (MAL 2.7 assumed): concurrency, published, model")
    for b, published in PUBLISHED.items():
        g = (1 + LOAD_SLOPE * (np.sqrt(b) - 1)) / (1 + LOAD_SLOPE * 0.0)
        model = mal / (1 + (c1 - 1) * g)
        print(f"  {b:4d}  {published:.2f}  {model:.2f}")
    print()
    header = "".join(f"{b:>7d}" for b in BATCHES)
    print(f"{'target: best arm speedup at batch':<44}{header}")
    rows = read_rows()
    for t in targets(rows):
        model = build_target(rows, t)
        exp = model.expected_tokens()
        best = [float((exp / model.cost(b)).max(axis=1).mean()) for b in BATCHES]
        print(f"{t:<44}" + "".join(f"{x:7.2f}" for x in best))
    print()
    print(f"{'target: longest K of each drafter, speedup':<44}{header}")
    for t in targets(rows):
        model = build_target(rows, t)
        exp = model.expected_tokens()
        for drafter, k in model.drafters.items():
            a = [arm.name for arm in model.arms].index(f"{drafter}/k={k}")
            sp = [float((exp[:, a] / model.cost(b)[:, a]).mean()) for b in BATCHES]
            print(f"{t + ' ' + drafter + '/k=' + str(k):<44}" + "".join(f"{x:7.2f}" for x in sp))


if __name__ == "__main__":
    main()
