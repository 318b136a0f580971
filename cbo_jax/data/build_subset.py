"""Build the bundled real-MNIST subset ``mnist_subset.npz`` from the IDX files.

    python -m cbo_jax.data.build_subset --idx-dir ../shared/data/mnist

Takes a class-stratified random sample (seeded, so the file is reproducible) of
1000 training images per digit (10 000) and 200 test images per digit (2 000), and
stores them uncompressed-dtype ``uint8`` in a compressed ``.npz`` with the SHA-256 of
the source files, so that the package works offline on a fresh machine.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np

from cbo_jax.federated.mnist import BUNDLED_PATH, load_idx_dir

TRAIN_PER_CLASS = 1000
TEST_PER_CLASS = 200
SEED = 20261121


def stratified(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    idx = np.concatenate([rng.choice(np.flatnonzero(labels == c), per_class, replace=False) for c in range(10)])
    return np.sort(idx)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--idx-dir", type=Path, required=True, help="directory holding the four MNIST IDX files")
    p.add_argument("--out", type=Path, default=BUNDLED_PATH)
    args = p.parse_args(argv)
    mnist = load_idx_dir(args.idx_dir)
    rng = np.random.default_rng(SEED)
    tr = stratified(mnist.train_labels, TRAIN_PER_CLASS, rng)
    te = stratified(mnist.test_labels, TEST_PER_CLASS, rng)
    digest = hashlib.sha256()
    for arr in mnist[:4]:
        digest.update(np.ascontiguousarray(arr).tobytes())
    np.savez_compressed(
        args.out,
        train_images=mnist.train_images[tr],
        train_labels=mnist.train_labels[tr].astype(np.uint8),
        test_images=mnist.test_images[te],
        test_labels=mnist.test_labels[te].astype(np.uint8),
        train_index=tr.astype(np.int32),
        test_index=te.astype(np.int32),
        source_sha256=np.array(digest.hexdigest()),
    )
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB): {len(tr)} train, {len(te)} test images")


if __name__ == "__main__":
    main()
