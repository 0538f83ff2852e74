# SPDX-License-Identifier: Apache-2.0
"""examples/python/train_hs.py at a small size: the loss goes down and top-5 beats the baselines."""
import pytest

train_hs = pytest.importorskip("train_hs")


@pytest.mark.parametrize("tree", ["uniform", "huffman"])
def test_train_hs_small(tree, capsys):
    result = train_hs.main(["--classes", "3000", "--steps", "300", "--dim", "24", "--batch", "128",
                            "--eval-batch", "1024", "--tree", tree, "--quiet"])
    out = capsys.readouterr().out
    assert "top-5 accuracy" in out
    assert result["last_loss"] < (0.6 if tree == "uniform" else 0.75) * result["first_loss"]
    # baselines: the 5 most frequent classes cover ~30% of the samples at N = 3000
    assert result["top5"] > (0.5 if tree == "uniform" else 0.35)


def test_train_hs_kmeans_tree_starts_from_the_class_vectors(capsys):
    # measured at this size: first loss 0.41 (the uniform tree's 3.16), held-out top-1 98.0 % (89.6 %)
    result = train_hs.main(["--classes", "3000", "--steps", "300", "--dim", "24", "--batch", "128",
                            "--eval-batch", "1024", "--tree", "kmeans", "--quiet"])
    assert "kmeans(branching=55, depth=2" in capsys.readouterr().out
    assert result["first_loss"] < 1.0 and result["last_loss"] < 0.6 * result["first_loss"]
    assert result["top1"] > 0.95


def test_train_hs_bf16_weights(capsys):
    result = train_hs.main(["--classes", "1000", "--steps", "150", "--dim", "16", "--batch", "64",
                            "--dtype", "bfloat16", "--quiet"])
    assert result["last_loss"] < 0.7 * result["first_loss"]
