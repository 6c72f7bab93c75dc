"""One line of the doctor's output, and how a check that breaks becomes one."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

from bertaccel.option import first_line

NAME_WIDTH = 10  # the item column: "xformers", "bertaccel" fit with room


@dataclass(frozen=True)
class Line:
    """`item  text`, and `fix` (one line) when something is missing and the text does not say how
    to get it. broken: the check itself could not be made (the doctor then exits 1)."""
    item: str
    text: str
    fix: Optional[str] = None
    broken: bool = False

    def render(self, width: int = NAME_WIDTH) -> List[str]:
        out = [f"{self.item:<{width}} {self.text}"]
        if self.fix and self.fix not in self.text:
            out.append(f"{'':<{width}} fix: {self.fix}")
        return out


def checked(item: str, check: Callable[[], List[Line]]) -> List[Line]:
    """The check's lines; when it raises, one broken line that says what broke (the other checks
    still run: one broken library must not hide what the doctor can say about the rest)."""
    try:
        return check()
    except Exception as e:  # noqa: BLE001 - any failure of a check is its answer
        return [Line(item, f"could not check: {type(e).__name__}: {first_line(e, limit=300)}",
                     fix="run it again with python -X faulthandler -m bertaccel.doctor and report the line above",
                     broken=True)]
