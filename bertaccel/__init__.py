import logging as _logging


def _from_torchao(record: _logging.LogRecord) -> bool:
    """False for torch's warning that torchao registers Enums it no longer needs to (its args' first
    item, the Enum class, comes from torchao): a deprecation notice to torchao, not to a user."""
    arg = record.args[0] if isinstance(record.args, tuple) and record.args else None
    return not str(getattr(arg, "__module__", "")).startswith("torchao")


# torchao (the fp8 extra) is imported by transformers' quantizers in every process where it is
# installed, and warns on stderr that its optional C++ kernels do not load (CPU-only torch, another
# Python); precision=fp8 uses none of them, and the warnings would break bad input's one line.
_logging.getLogger("torchao").setLevel(_logging.ERROR)
_logging.getLogger("torch.utils._pytree").addFilter(_from_torchao)
