"""`.env` next to the play, read the way python-dotenv (and most tools) read it: an inline
`# comment` after a value is not part of it; quotes, escapes and `export` are understood."""

from __future__ import annotations

from pathlib import Path

from deepline_cli.runtime.providers.secrets import read_dotenv

DOTENV = """\
# the keys of the prod account
export PLAIN=abc123def   # prod
QUOTED="has # a hash"  # and a comment
SINGLE='no \\n escapes # here'
ESCAPED="line\\nbreak"
EMPTY=
SPACED = spaced value
"""


def test_dotenv_values_are_read_as_dotenv_reads_them(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(DOTENV)
    assert read_dotenv(tmp_path / ".env") == {
        "PLAIN": "abc123def",
        "QUOTED": "has # a hash",
        "SINGLE": "no \\n escapes # here",
        "ESCAPED": "line\nbreak",
        "EMPTY": "",
        "SPACED": "spaced value",
    }
    assert read_dotenv(tmp_path / "missing.env") == {}
