"""Writes the example data of recipes/tiny-own-data.yaml: "reverse sort : Pam Ann Lee" -> "Pam Lee Ann".

A list operation none of the task suites has (the `lists` suite sorts ascending and reverses, but never
both), in words the bundled tokenizer knows, so a fine-tune of `tiny` on it shows what `data.files`
adds. Train and test lists are disjoint; the output is the same for the same --seed.

    python recipes/data/make_reverse_sort.py [--train 2000] [--test 200] [--seed 0] [--out recipes/data]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ["Ann", "Bob", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal", "Ida", "Jon", "Kim", "Lee", "Max", "Ned", "Oli",
         "Pam"]


def draw(rng: random.Random) -> tuple[str, ...]:
    return tuple(rng.sample(NAMES, rng.randint(3, 7)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent))
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    seen: set[tuple[str, ...]] = set()
    for split, n in (("test", args.test), ("train", args.train)):
        rows = []
        while len(rows) < n:
            names = draw(rng)
            if names in seen:
                continue
            seen.add(names)
            rows.append({"prompt": "reverse sort : " + " ".join(names),
                         "response": " ".join(sorted(names, reverse=True))})
        path = Path(args.out) / f"reverse-sort-{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {path} ({n} examples)")


if __name__ == "__main__":
    main()
