"""Rebuild the bundled AG News sample from the shared AG News test split.

The 120k-row AG News train split is not available offline, so the bundled sample is a
stratified, seeded split of the official 7,600-row *test* split into our own train (6,000)
and test (1,600) parts. Run: python -m bertaccel.samples.build_ag_news_sample PATH/test.csv.gz
"""
import csv
import gzip
import io
import random
import sys
from pathlib import Path

TEST_ROWS_PER_CLASS = 400  # 4 classes -> 1,600 test rows, the remaining 6,000 train
SEED = 0
OUT_DIR = Path(__file__).parent / "ag_news"


def main(source: str) -> None:
    with gzip.open(source, "rt", newline="", encoding="utf-8") as f:
        rows = [(int(r[0]) - 1, r[1], r[2]) for r in csv.reader(f)]  # labels 1-4 -> 0-3
    random.Random(SEED).shuffle(rows)
    test, train, taken = [], [], {c: 0 for c in range(4)}
    for row in rows:
        if taken[row[0]] < TEST_ROWS_PER_CLASS:
            taken[row[0]] += 1
            test.append(row)
        else:
            train.append(row)
    for name, part in (("train", train), ("test", test)):
        # mtime=0 keeps the gzip bytes reproducible
        with open(OUT_DIR / f"{name}.csv.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            with io.TextIOWrapper(gz, encoding="utf-8", newline="") as f:
                w = csv.writer(f)
                w.writerow(["title", "description", "label"])
                for label, title, desc in part:
                    w.writerow([title, desc, label])
    print(f"train={len(train)} test={len(test)} -> {OUT_DIR}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/ag_news/test.csv.gz")
