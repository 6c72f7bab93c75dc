"""python -m bertaccel.doctor: see bertaccel/doctor/__init__.py."""
from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    from bertaccel.doctor import __doc__ as about
    from bertaccel.report.args import OneLineParser

    OneLineParser(prog="python -m bertaccel.doctor", description=about.splitlines()[0]).parse_args(argv)
    # After the arguments: a typo is refused before the seconds of imports below.
    from bertaccel.doctor import machine
    from bertaccel.doctor.lines import checked
    from bertaccel.doctor.options import option_lines

    nvml = machine.ask_nvml()
    broken = False
    for item, check in (("python", machine.where), ("gpu", lambda: machine.gpus(nvml)), ("torch", machine.torch_line),
                        ("triton", machine.triton_line), ("xformers", machine.xformers_line),
                        ("nvml", lambda: machine.nvml_line(nvml)), ("rapl", machine.rapl_line),
                        ("options", option_lines)):
        for line in checked(item, check):
            print("\n".join(line.render()), flush=True)  # as each check ends: the options take seconds
            broken = broken or line.broken
    return 1 if broken else 0


if __name__ == "__main__":
    from bertaccel.runs.interrupt import quiet_when_stdout_closes

    quiet_when_stdout_closes()  # `doctor | head -1`: no BrokenPipeError
    sys.exit(main())
