"""A sync site names its code line without doubt: two files of one name are two sites, a library's
file goes by its import path, the user's by its path under the working directory, each with the
line and the function; and a site fits the server's column (its tail kept)."""

import json
import os
import subprocess
import sys
import sysconfig
import warnings
from unittest import mock

import torch

from packscope.agent.sync_sites import caller_site, shown_path
from packscope.agent.syncs import SYNC_WARNING, SyncCounter
from packscope.core.catalogue import MAX_SITE_LENGTH

TORCH_FILE = os.path.join(os.path.dirname(torch.__file__), "fake_op.py")


def compiled(source: str, filename: str) -> dict:
    namespace: dict = {"caller_site": caller_site, "warnings": warnings, "MESSAGE": SYNC_WARNING}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def test_a_file_is_shown_by_its_import_path_or_its_path_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    library = sysconfig.get_paths()["purelib"]
    assert shown_path(os.path.join(library, "somelib", "utils.py")) == os.path.join("somelib", "utils.py")
    assert shown_path(json.__file__) == os.path.join("json", "__init__.py")  # the standard library
    assert shown_path(str(tmp_path / "project" / "utils.py")) == os.path.join("project", "utils.py")
    assert shown_path("/elsewhere/utils.py") == "/elsewhere/utils.py"
    assert shown_path("<string>") == "<string>"
    undecodable = shown_path("/elsewhere/caf\udce9.py")  # a name's byte that is not UTF-8
    assert undecodable == "/elsewhere/caf\\udce9.py" and undecodable.encode("utf-8")


def test_two_files_of_one_name_are_two_sites_with_their_functions(tmp_path, monkeypatch):
    """The issue's case: syncs in a/utils.py and b/utils.py were both "utils.py:3"."""
    monkeypatch.chdir(tmp_path)
    source = "class Loader:\n    def next(self):\n        warnings.warn(MESSAGE, UserWarning)\n"
    loaders = [compiled(source, str(tmp_path / part / "utils.py"))["Loader"]() for part in ("a", "b")]
    with (
        mock.patch("torch.cuda.is_available", return_value=True),
        mock.patch("torch.cuda.get_sync_debug_mode", return_value=0),
        mock.patch("torch.cuda.set_sync_debug_mode"),
        warnings.catch_warnings(),
    ):
        counter = SyncCounter().install()
        try:
            for loader in loaders:
                loader.next()
        finally:
            counter.uninstall()
    a, b = (os.path.join(part, "utils.py") for part in ("a", "b"))
    assert counter.snapshot()[1] == {f"{a}:3 in Loader.next": 1, f"{b}:3 in Loader.next": 1}


def test_a_long_site_keeps_its_tail_within_the_servers_length(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    deep = tmp_path.joinpath(*["a_rather_long_directory_name"] * 30, "utils.py")
    assert len(str(deep)) > MAX_SITE_LENGTH
    through_torch = compiled("def op():\n    return caller_site()\n", TORCH_FILE)
    user = compiled("def step(op):\n    return op()\n", str(deep))
    site = user["step"](through_torch["op"])
    whole = f"{deep.relative_to(tmp_path)}:2 in step"
    assert len(site) == MAX_SITE_LENGTH and site == "…" + whole[len(whole) - MAX_SITE_LENGTH + 1 :]


def test_a_script_is_named_as_the_working_directory_sees_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom packscope.agent.sync_sites import caller_site\n"
        "def main():\n    print(caller_site())\nmain()\n"
    )
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "train.py:4 in main"
