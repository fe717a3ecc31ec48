"""The lines bench/gpu_check.sh prints from what its parts wrote: the install part's
versions, and each part's key figure for the summary table. `key` exits 1 where the files
show a failure that no exit status gave: a benchmark row with an error, a training or decode
that left no result, or a restart that compiled its train step instead of loading it from
the persistent compilation cache. Targets (issue 29) are printed beside the figures; a
missed target is a finding to write up, not a failure.

    python3 bench/gpu_check_figures.py versions
    python3 bench/gpu_check_figures.py key speed runs/gpu_check
"""

import argparse
import importlib.metadata
import json
import pathlib
import re
import shutil
import subprocess
import sys

TARGET_VS_TORCH = 1.0  # GPT126M with default settings over the PyTorch peer
TARGET_LLAMA_MFU = 0.45
TARGET_FP8_SPEEDUP = 1.2
TARGET_FP8_LOSS = 0.02  # FP8's loss within 2% of bfloat16's after the same steps
# runner/training/compile_log.py's line for a train step the restart loaded.
CACHE_LOAD = re.compile(r"compiled jit\(_train_step\) in ([\d.]+)s \(loaded from the "
                        r"persistent compilation cache")
PYTEST_TOTALS = re.compile(r"\d+ (passed|failed|errors?|skipped|deselected)")
TRAINING = re.compile(r"^training (\w+):")
STEP_LOSS = re.compile(r"^step +(\d+) \| loss ([\d.]+)")
# How XLA (and jax's allocator) say that a program does not fit the device.
OUT_OF_MEMORY = re.compile(r"RESOURCE_EXHAUSTED|out of memory", re.IGNORECASE)


class Failed(Exception):
    """The part's files show a failure; the message is its key figure."""


def distribution(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def versions() -> str:
    import jax
    import jaxlib

    try:  # jax has no public cuDNN version; its own cuDNN attention reads this one
        from jax._src.lib import cuda_versions

        cudnn = cuda_versions.cudnn_get_version() if cuda_versions else None
    except Exception:  # a private module: moved or broken in some jax
        cudnn = None
    driver = "-"
    if shutil.which("nvidia-smi"):
        query = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                "--format=csv,noheader"], capture_output=True, text=True)
        driver = (query.stdout.split("\n")[0].strip() or "-") if query.returncode == 0 else "-"
    devices = jax.devices()
    cudnn_text = f"{cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}" if cudnn else "-"
    return (f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, cuDNN {cudnn_text}, "
            f"driver {driver}, {devices[0].device_kind} x{len(devices)}; "
            f"torch {distribution('torch')}, praxis {distribution('praxis')}, "
            f"pytest-timeout {distribution('pytest-timeout')}")


def read(out: pathlib.Path, name: str) -> str:
    path = out / name
    if not path.exists():
        raise Failed(f"no {name}")
    return path.read_text(errors="replace")


def key_install(out: pathlib.Path) -> str:
    lines = [line for line in read(out, "install.log").splitlines() if line.startswith("jax ")]
    if not lines:
        raise Failed("no versions line: jax did not start")
    return lines[-1]


def key_tests(out: pathlib.Path) -> str:
    totals = [line.strip(" =") for line in read(out, "tests.log").splitlines()
              if PYTEST_TOTALS.search(line)]
    if not totals:
        raise Failed("no pytest totals line")
    return totals[-1]


def key_default(out: pathlib.Path) -> str:
    """Each family's last logged loss, the decodes, and the restart's cache load."""
    losses, family = {}, None
    log = read(out, "default.log")
    for line in log.splitlines():
        if match := TRAINING.match(line):
            family = match.group(1)
        elif (match := STEP_LOSS.match(line)) and family:
            losses[family] = f"{family} loss {float(match.group(2)):.3f} at step {match.group(1)}"
    decodes = log.count("continuation(s) to ")
    load = CACHE_LOAD.search(read(out, "default_restart.log"))
    restart = (f"restart loaded its train step from the cache in {load.group(1)}s" if load
               else "restart did NOT load its train step from the persistent cache")
    key = f"{', '.join(losses.values()) or 'no loss logged'}; {decodes} decode(s); {restart}"
    if len(losses) < 2 or decodes < 2 or not load:
        raise Failed(key)
    return key


def rows(out: pathlib.Path, *names: str) -> list[dict]:
    found = [row for name in names if (out / name).exists()
             for row in json.loads((out / name).read_text())]
    if not found:
        raise Failed(f"no rows in {', '.join(names)}")
    return found


def key_speed(out: pathlib.Path) -> str:
    parts, failed = [], False
    for row in rows(out, "speed_gpt126m.json", "speed_large.json"):
        name = row["experiment"]
        if "error" in row or "skipped" in row:
            failed = True
            parts.append(f"{name} {row['attention']}: {row.get('error') or row['skipped']}")
        elif row["attention"] != "torch":
            text = f"{name} {row['mfu']:.1%} MFU" if row.get("mfu") else f"{name} no MFU"
            if row.get("vs_torch"):
                text += f", x{row['vs_torch']:.2f} torch (target {TARGET_VS_TORCH:.1f})"
            elif name == "Synthetic126M":  # the comparison is what this row is for
                failed = True
                text += ", no PyTorch peer row (is torch installed?)"
            if name == "Llama1B":
                text += f" (target {TARGET_LLAMA_MFU:.0%})"
            parts.append(text)
    if failed:
        raise Failed("; ".join(parts))
    return "; ".join(parts)


def key_moe(out: pathlib.Path) -> str:
    """Each row's MFU (on a token's active parameters) and peak memory, and the MoE row's
    tokens/s over its dense peer's (no target: the first figures are the finding)."""
    parts, done, failed = [], {}, False
    for row in rows(out, "moe.json"):
        name = row["experiment"]
        if "error" in row or "skipped" in row:
            failed = True
            parts.append(f"{name}: {row.get('error') or row['skipped']}")
            continue
        text = f"{name} {row['mfu']:.1%} MFU" if row.get("mfu") else f"{name} no MFU"
        if row.get("peak_memory_gib"):
            text += f", peak {row['peak_memory_gib']:.1f} GiB"
        done[name] = (len(parts), row)
        parts.append(text)
    if "Qwen3A3B_moe" in done and "Qwen3A3B_dense" in done:
        (index, moe), (_, dense) = done["Qwen3A3B_moe"], done["Qwen3A3B_dense"]
        parts[index] += f", x{moe['tokens_per_s'] / dense['tokens_per_s']:.2f} dense tokens/s"
    if failed:
        raise Failed("; ".join(parts))
    return "; ".join(parts)


def key_fp8(out: pathlib.Path) -> str:
    found = rows(out, "fp8.json")
    errors = [f"{r['experiment']}{' fp8' if r.get('fp8') else ''}: {r['error']}"
              for r in found if "error" in r]
    if errors:
        raise Failed("; ".join(errors))
    base = next((r for r in found if not r.get("fp8")), None)
    fp8 = next((r for r in found if r.get("fp8") and "vs_bf16" in r), None)
    if base is None or fp8 is None:
        raise Failed("no FP8 row after its bfloat16 row")
    loss = fp8["loss_delta"] / base["last_loss"]
    gemms = f"{fp8['fp8_gemms']}/{fp8['cublas_gemms']}" if "cublas_gemms" in fp8 else "-"
    return (f"FP8 x{fp8['vs_bf16']:.2f} bf16 (target {TARGET_FP8_SPEEDUP}); loss after "
            f"{fp8['steps_run']} steps {fp8['last_loss']:.4f} vs {base['last_loss']:.4f} "
            f"({loss:+.2%}, target within {TARGET_FP8_LOSS:.0%}); f8 GEMMs {gemms}")


def key_long(out: pathlib.Path) -> str:
    """The longest sequence that trained, with its speed and memory; the rows after it may
    run out of memory (that ends the search), but any other error fails the part, as does
    no row trained."""
    parts, longest, failed = [], None, False
    for row in rows(out, "long.json"):
        if "error" not in row and "skipped" not in row:
            longest = row
            parts.append(f"{row['seq_len']:,} tokens: {row['tokens_per_s']:,.0f} tokens/s, "
                         f"{row['mfu']:.1%} MFU, peak {row['peak_memory_gib']:.1f} GiB")
        elif longest is not None and OUT_OF_MEMORY.search(row.get("error", "")):
            parts.append(f"{row['experiment']}: out of memory")
        else:
            failed = True
            parts.append(f"{row['experiment']}: {row.get('error') or row['skipped']}")
    key = f"longest {longest['seq_len']:,} tokens; " if longest else "no length trained; "
    if failed or longest is None:
        raise Failed(key + "; ".join(parts))
    return key + "; ".join(parts)


KEYS = {"install": key_install, "tests": key_tests, "default": key_default,
        "speed": key_speed, "moe": key_moe, "fp8": key_fp8, "long": key_long}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("versions", help="jax, jaxlib, cuDNN, driver, devices")
    key = commands.add_parser("key", help="a part's key figure from its files in OUT")
    key.add_argument("part", choices=KEYS)
    key.add_argument("out", type=pathlib.Path)
    args = parser.parse_args()
    if args.command == "versions":
        print(versions())
        return 0
    try:
        print(KEYS[args.part](args.out))
    except Failed as failure:
        print(failure)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
