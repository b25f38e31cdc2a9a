"""A tree of tokens decoded in one batch (patch 0021, `llama_set_tree`) on the tiny qwen35 target (f32):
every token gets the logits that decoding the path from the root to it gives, within a few times
the noise of two plain decodings of the same path. A DDTree as the server would build it, a chain
and a star are checked; decoded as a plain chain the same tokens must differ at the branches
(so the comparison can fail); trees out of pre-order or with wrong positions are refused. Then
(patch 0021, `llama_tree_commit`) every path of each tree is committed and one more token decoded:
its logits are those of decoding the prompt, the path and the token plainly, and not those of a
neighbour's path. Last (patch 0023) the server's walk on a constructed case: the target's
continuation starts with the drafter's second candidate; the tree takes it and the tokens after
it, the top-1 chain of the same candidates takes none."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

slow = pytest.mark.slow


@slow
def test_every_token_of_a_tree_gets_its_paths_logits(llama_bin: Path, tiny_pair_f32: tuple[Path, Path]) -> None:
    # f32 matrices: a token decoded alone and in a batch agree to rounding (the noise control)
    target, _ = tiny_pair_f32
    ngl = os.environ.get("BUUN_TEST_NGL", "0")  # 99 against a GPU build, as the harness
    r = subprocess.run([str(llama_bin / "test-tree-decode"), "-m", str(target), "-ngl", ngl],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    out = r.stdout
    for tree in ("ddtree depth 7 k 3 budget 14", "chain 8", "star 6"):
        assert re.search(rf"^{re.escape(tree)}.*: every node as its path .* ok$", out, re.M), out
    # the chain has no branch to tell apart; the other two must differ as a plain chain
    assert len(re.findall(r"as a plain chain it differs at the branches .* ok$", out, re.M)) == 2, out
    # 0021: every path committed, then a token, as if decoded plainly; a neighbour's path differs
    assert len(re.findall(r"each path committed, then a token, as decoded plainly .* ok$", out, re.M)) == 3, out
    assert len(re.findall(r"a neighbour's path differs after the commit .* ok$", out, re.M)) == 2, out
    # 0023: the server's walk takes a branch off the drafter's top-1 chain where the target's token lies
    for walk in ("walk: the top-1 chain takes no draft, its bonus is the target's token",
                 "walk: the tree takes the second candidate and the three after it, then the bonus"):
        assert re.search(rf"^{re.escape(walk)}\s+ok$", out, re.M), out
    assert re.search(r"^walk: after the commit the bonus decodes as plainly .* ok$", out, re.M), out
    for refusal in ("a commit of tokens that are no path is refused",
                    "a commit after a plain batch is refused",
                    "a parent off the path to the token before is refused",
                    "a position that is not its parent's plus one is refused",
                    "a plain batch after a refused tree decodes"):
        assert re.search(rf"^{re.escape(refusal)}\s+ok$", out, re.M), out
    assert re.search(r"^\d+ passed, 0 failed$", out, re.M), out


# patch 0023's flags: a bad value is refused when the arguments are read, saying what is expected
BAD_TREE_FLAGS = [
    (["--spec-tree-budget", "300"], "the tree budget must be within [0, 256]"),
    (["--spec-tree-k", "0"], "the tree's candidates per depth must be within [1, 64]"),
    (["--spec-synth-tree", "0.5:0.9"], "expected U:E1,E2,...:H1,H2,... (three fields separated by ':')"),
    (["--spec-synth-tree", "2:0.9:0.3"], "'2' is not a number within [0, 1]"),
    (["--spec-synth-tree", "0.5:0.9,0.2:0.3"], "the easy rates sum to more than 1"),
]


@pytest.mark.parametrize(("args", "message"), BAD_TREE_FLAGS)
def test_bad_tree_flags_are_refused(llama_bin: Path, args: list[str], message: str) -> None:
    r = subprocess.run([str(llama_bin / "llama-server"), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert message in r.stdout + r.stderr


@slow
def test_a_tree_takes_the_tree_profile_not_a_chain_rate(llama_bin: Path, tiny_pair_f32: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    """A tree budget with --spec-synth-len (a chain's synthetic rate) would verify trees the rate
    cannot describe: the server refuses to start and says which flag to use."""
    target, drafter = tiny_pair_f32
    r = subprocess.run([str(llama_bin / "llama-server"), "-m", str(target), "-md", str(drafter), "--spec-type",
                        "dflash", "-np", "1", "-c", "1024", "--port", "0", "--spec-tree-budget", "22",
                        "--spec-synth-len", "3"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "a tree budget takes --spec-synth-tree" in r.stdout + r.stderr
