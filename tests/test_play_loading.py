"""Loading a play from `path.py[:function-or-play-name]` (deepline_cli/runtime/play.py)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from deepline_cli.errors import PlayLoadError
from deepline_cli.runtime.run.play import PlayDef, load_play


@pytest.fixture(autouse=True)
def _restore_sys_path() -> Iterator[None]:
    """Loading a play puts its directory on sys.path; keep that inside each test."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved


def write(tmp_path: Path, source: str, name: str = "play.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def load_error(ref: str, **kwargs: object) -> str:
    with pytest.raises(PlayLoadError) as info:
        load_play(ref, **kwargs)  # type: ignore[arg-type]
    assert info.value.exit_code == 2
    return str(info.value)


TWO_PLAYS = """\
    from deepline_cli import play


    @play("first-play", description="the first")
    async def first(ctx, input):
        return 1


    @play("second-play")
    async def second(ctx, input):
        return 2
    """


def test_single_play_needs_no_selector(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        from deepline_cli import play

        @play("only-one", description="the only play")
        async def only(ctx, input):
            return input
        """,
    )

    loaded = load_play(str(path))

    assert isinstance(loaded, PlayDef)
    assert (loaded.name, loaded.description, loaded.function) == ("only-one", "the only play", "only")
    assert loaded.file == str(path.resolve())
    assert loaded.ref == f"{path.resolve()}:only"


def test_the_ref_of_a_loaded_play_loads_it_again(tmp_path: Path) -> None:
    path = write(tmp_path, TWO_PLAYS)

    loaded = load_play(f"{path}:second-play")

    assert load_play(loaded.ref).name == "second-play"


def test_relative_path_and_missing_suffix(tmp_path: Path) -> None:
    write(tmp_path, TWO_PLAYS, name="leads.py")

    assert load_play("leads.py:first", base=tmp_path).name == "first-play"
    assert load_play("leads:second", base=tmp_path).name == "second-play"


def test_several_plays_without_selector_list_their_names(tmp_path: Path) -> None:
    path = write(tmp_path, TWO_PLAYS)

    message = load_error(str(path))

    assert "several plays (first (play 'first-play'), second (play 'second-play'))" in message, message
    assert "play.py:NAME" in message


@pytest.mark.parametrize(
    ("selector", "name"),
    [
        ("first", "first-play"),
        ("second", "second-play"),
        ("first-play", "first-play"),
        ("second-play", "second-play"),
    ],
)
def test_selector_by_function_name_or_play_name(tmp_path: Path, selector: str, name: str) -> None:
    path = write(tmp_path, TWO_PLAYS)

    assert load_play(f"{path}:{selector}").name == name


def test_unknown_selector_lists_the_plays(tmp_path: Path) -> None:
    path = write(tmp_path, TWO_PLAYS)

    message = load_error(f"{path}:third")

    assert "'third'" in message
    assert "first" in message and "second" in message


def test_missing_file(tmp_path: Path) -> None:
    message = load_error(str(tmp_path / "nope.py"))

    assert str(tmp_path / "nope.py") in message
    assert "does not exist" in message


def test_missing_file_with_selector(tmp_path: Path) -> None:
    assert "does not exist" in load_error(f"{tmp_path / 'nope.py'}:main")


def test_directory(tmp_path: Path) -> None:
    (tmp_path / "plays").mkdir()

    message = load_error(str(tmp_path / "plays"))

    assert "directory" in message
    assert str(tmp_path / "plays") in message


def test_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        from deepline_cli import play

        @play("broken")
        async def broken(ctx, input)
            return 1
        """,
    )

    message = load_error(str(path))

    assert "Syntax error" in message
    assert str(path) in message
    assert "line 4" in message


def test_import_error_inside_the_play_names_the_exception_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        from deepline_cli import play

        import a_module_that_does_not_exist_anywhere

        @play("never")
        async def never(ctx, input):
            return 1
        """,
    )

    message = load_error(str(path))

    assert "ModuleNotFoundError" in message
    assert "a_module_that_does_not_exist_anywhere" in message
    assert str(path) in message
    assert "line 3" in message
    assert "Traceback" not in message


def test_error_raised_while_importing_names_the_exception_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        from deepline_cli import play

        SETTINGS = {"a": 1}
        LIMIT = SETTINGS["limit"]
        """,
    )

    message = load_error(str(path))

    assert "KeyError" in message
    assert "'limit'" in message
    assert "line 4" in message


def test_a_failed_import_can_be_fixed_and_loaded_again(tmp_path: Path) -> None:
    path = write(tmp_path, "raise RuntimeError('not yet')\n")
    assert "RuntimeError" in load_error(str(path))

    write(tmp_path, TWO_PLAYS)

    assert load_play(f"{path}:first").name == "first-play"


def test_file_without_a_play(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        from deepline_cli import tool

        @tool("play-loading.helper")
        async def helper(input):
            return input

        async def not_decorated(ctx, input):
            return 1
        """,
    )

    message = load_error(str(path))

    assert "declares no play" in message
    assert str(path) in message


def test_plays_imported_from_another_module_are_not_this_modules_plays(tmp_path: Path) -> None:
    write(
        tmp_path,
        """\
        from deepline_cli import play

        @play("imported-helper-play")
        async def helper_play(ctx, input):
            return "helper"
        """,
        name="play_loading_imported_helpers.py",
    )
    path = write(
        tmp_path,
        """\
        from deepline_cli import play
        from play_loading_imported_helpers import helper_play

        @play("own-play")
        async def own(ctx, input):
            return "own"
        """,
    )

    loaded = load_play(str(path))

    assert loaded.name == "own-play"
    message = load_error(f"{path}:helper_play")
    assert message.endswith("has no play 'helper_play'; it declares: own (play 'own-play')."), message
    assert "helper_play" not in message.split("it declares:")[-1]


def test_a_module_that_only_imports_a_play_declares_none(tmp_path: Path) -> None:
    write(
        tmp_path,
        """\
        from deepline_cli import play

        @play("reexported-play")
        async def reexported(ctx, input):
            return 1
        """,
        name="play_loading_reexport_source.py",
    )
    path = write(tmp_path, "from play_loading_reexport_source import reexported\n")

    assert "declares no play" in load_error(str(path))


def test_non_async_play_function(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        from deepline_cli import play

        @play("sync-play")
        def sync_play(ctx, input):
            return 1
        """,
    )

    message = load_error(str(path))

    assert "'sync-play'" in message
    assert "async" in message


def test_a_play_bound_to_two_names_is_one_play(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        from deepline_cli import play

        @play("aliased")
        async def aliased(ctx, input):
            return 1

        main = aliased
        """,
    )

    assert load_play(str(path)).name == "aliased"


def test_play_in_a_directory_whose_name_has_a_colon(tmp_path: Path) -> None:
    folder = tmp_path / "batch-12:30"
    folder.mkdir()
    path = write(folder, TWO_PLAYS)

    assert load_play(f"{path}:second").name == "second-play"
    assert "several plays" in load_error(str(path))


def test_a_play_imports_its_own_folders_helpers_whichever_folder_loaded_last(tmp_path: Path) -> None:
    """A worker loads plays of several projects in one process, each with its own
    `helpers.py`: a play loaded again after another project's gets its own folder's, not
    the one whose folder went on sys.path last."""
    from deepline_cli.runtime.run.play import load_module

    modules = {}
    for project in ("x", "y"):
        folder = tmp_path / project
        folder.mkdir()
        (folder / "helpers.py").write_text(f"VALUE = {project!r}\n")
        (folder / "play.py").write_text("import helpers\nSEEN = helpers.VALUE\n")
        modules[project] = folder / "play.py"
    try:
        for project in ("x", "y", "x", "y"):
            seen = load_module(modules[project]).SEEN
            assert seen == project
    finally:
        sys.modules.pop("helpers", None)
