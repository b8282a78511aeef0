"""Provenance records the git state of bench's own source, not of whatever repository encloses the
working directory (or the environment's GIT_DIR), and nothing, with a reason, when bench is not in a
git checkout (installed into a folder that some other repository happens to enclose)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bench
from bench.metrics import provenance

BENCH_PKG = Path(bench.__file__).resolve().parent


def _git(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _other_repo(path: Path) -> str:
    """A git repository with one commit at ``path``; returns its HEAD."""
    path.mkdir(parents=True, exist_ok=True)
    _git("init", "-q", cwd=path)
    (path / "README").write_text("not bench\n")
    _git("add", "README", cwd=path)
    _git("commit", "-q", "-m", "other", cwd=path)
    return _git("rev-parse", "HEAD", cwd=path)


@pytest.fixture
def bench_head() -> str:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    try:
        _git("ls-files", "--error-unmatch", "__init__.py", cwd=BENCH_PKG)
        return _git("rev-parse", "HEAD", cwd=BENCH_PKG)
    except subprocess.CalledProcessError:
        pytest.skip("bench's source is not in a git checkout here")


def test_commit_is_benchs_from_another_repos_cwd(tmp_path, monkeypatch, bench_head):
    other = _other_repo(tmp_path / "other")
    monkeypatch.chdir(tmp_path / "other")
    prov = provenance.collect(["x"], [None])
    assert prov["git_commit"] == bench_head != other
    assert isinstance(prov["git_dirty"], bool) and prov.get("git_commit_reason") is None


def test_commit_is_benchs_under_another_repos_git_dir(tmp_path, monkeypatch, bench_head):
    other = _other_repo(tmp_path / "other")
    monkeypatch.chdir(tmp_path / "other")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "other" / ".git"))  # as inside a git hook
    assert provenance.collect(["x"], [None])["git_commit"] == bench_head != other


def test_no_commit_when_bench_is_not_in_a_git_checkout(tmp_path):
    """bench installed (a copy, untracked) into a folder inside another repository, as a virtual
    environment's site-packages inside a project's checkout: that repository's commit is not bench's."""
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    _other_repo(tmp_path / "project")
    site = tmp_path / "project" / "venv" / "site-packages"
    shutil.copytree(BENCH_PKG, site / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["PYTHONPATH"] = str(site)
    code = ("import json, bench.metrics.provenance as p; assert p.__file__.startswith(%r), p.__file__; "
            "print(json.dumps(p.collect(['x'], [None])))" % str(site))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "project", env=env, check=True,
                         capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["git_commit"] is None and got["git_dirty"] is None, got["git_commit"]
    assert "not tracked" in got["git_commit_reason"], got["git_commit_reason"]

    # and outside any repository at all
    outside = tmp_path.parent / (tmp_path.name + "-nogit")
    shutil.copytree(site, outside)
    env["PYTHONPATH"] = str(outside)
    code = code.replace(repr(str(site)), repr(str(outside)))
    env["GIT_CEILING_DIRECTORIES"] = str(tmp_path.parent)  # in case the temporary folder is itself in a checkout
    out = subprocess.run([sys.executable, "-c", code], cwd=outside, env=env, check=True,
                         capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["git_commit"] is None and "not in a git checkout" in got["git_commit_reason"], got["git_commit_reason"]
    shutil.rmtree(outside)
