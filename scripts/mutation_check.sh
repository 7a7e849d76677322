#!/usr/bin/env bash
# Mutation check of the engine's core files, by hand (not in CI; docs/testing.md has the figures).
#
#   scripts/mutation_check.sh REF TEST_FILE...
#
# Exports REF (a commit, or "worktree" for the files as they are) into a scratch folder, mutates
# engine/worker/sampler.py, engine/kv_cache/block_pool.py, engine/kv_cache/manager.py and
# engine/sched/scheduler.py with mutmut (in a REF from before the engine's sub-packages: engine/sampler.py,
# block_pool.py, kv_cache_manager.py and scheduler.py), and runs only the given test files against a
# fixed 1-in-5 sample of the mutants (every 5th per file, in name order) with one worker, so a run
# takes about 10-15 minutes on a loaded 2-core machine.
# With ONLY=FILE, only the mutants named in FILE (one a line) run, e.g. the survivors of an earlier
# run re-checked after adding tests (a test added never lets a killed mutant live again).
# mutmut lives in its own virtual environment (MUTMUT_VENV), never in .venv; it sees .venv's
# packages through a .pth file.
set -euo pipefail

ref=${1:?usage: $0 REF TEST_FILE...}
shift
[ $# -gt 0 ] || { echo "usage: $0 REF TEST_FILE..." >&2; exit 2; }
repo=$(git rev-parse --show-toplevel)
only=${ONLY:+$(realpath "$ONLY")}
scratch=${MUTATION_DIR:-${TMPDIR:-/tmp}/formwork-mutation-$ref}
venv=${MUTMUT_VENV:-${TMPDIR:-/tmp}/formwork-mutmut}

if [ ! -x "$venv/bin/mutmut" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q mutmut==3.8.1
fi
site=$("$repo/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pyver=$("$venv/bin/python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
echo "$site" > "$venv/lib/$pyver/site-packages/zz_formwork_venv.pth"

rm -rf "$scratch" && mkdir -p "$scratch"
if [ "$ref" = worktree ]; then
    git -C "$repo" ls-files -co --exclude-standard | grep -v '^\.venv$\|node_modules' | \
        tar -C "$repo" -cf - -T - | tar -C "$scratch" -xf -
else
    git -C "$repo" archive "$ref" | tar -C "$scratch" -xf -
fi
cd "$scratch"
# each file where REF has it: the sub-package layout, or the flat engine/ of older commits
sources=()
for candidates in "engine/worker/sampler.py engine/sampler.py" \
        "engine/kv_cache/block_pool.py engine/block_pool.py" \
        "engine/kv_cache/manager.py engine/kv_cache_manager.py" \
        "engine/sched/scheduler.py engine/scheduler.py"; do
    found=
    for path in $candidates; do
        [ -f "$path" ] && { found=$path; break; }
    done
    [ -n "$found" ] || { echo "none of $candidates in $ref" >&2; exit 2; }
    sources+=("$found")
done
block_pool_module=$(echo "${sources[1]%.py}" | tr / .)
{
    printf '[mutmut]\nsource_paths=\n'
    printf '    %s\n' "${sources[@]}"
    printf 'also_copy=\n'
    printf '    %s\n' engine grammar service bench tests
    # a mutant that makes a test loop is stopped at 5x the clean run's time (mutmut's default is 15x)
    printf 'timeout_multiplier=5.0\n'
    printf 'pytest_add_cli_args_test_selection=\n'
    printf '    %s\n' "$@"
} > setup.cfg

# mutmut forks a child per mutant from a process that has run torch: with an OpenMP thread pool
# the child deadlocks on its first parallel op and the mutant counts as a timeout (a false kill)
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# the first run writes every mutant (and its name) and checks one; then the sample runs
nice -n 10 "$venv/bin/mutmut" run --max-children 1 "$block_pool_module.x_hash_block__mutmut_1" > mutmut-run.log 2>&1
"$venv/bin/python" - <<'EOF_PY' > mutant-sample.txt
import glob, json, re
names = []
for meta in sorted(glob.glob("mutants/engine/**/*.py.meta", recursive=True)):
    keys = list(json.load(open(meta))["exit_code_by_key"])
    keys.sort(key=lambda k: (re.sub(r"__mutmut_\d+$", "", k), int(k.rsplit("_", 1)[1])))
    names += keys[::5]
print("\n".join(names))
EOF_PY
if [ -n "$only" ]; then
    grep -Fxf "$only" mutant-sample.txt > only.txt || true
    mv only.txt mutant-sample.txt
fi
echo "$(wc -l < mutant-sample.txt) mutants in the sample"
nice -n 10 "$venv/bin/mutmut" run --max-children 1 $(cat mutant-sample.txt) >> mutmut-run.log 2>&1 || true
"$venv/bin/python" - <<'EOF_PY'
import glob, json
from mutmut.stats import status_by_exit_code
sample = set(open("mutant-sample.txt").read().split())
KILLED = {"killed", "timeout", "segfault"}  # the tests noticed
totals = {}
for meta in sorted(glob.glob("mutants/engine/**/*.py.meta", recursive=True)):
    codes = json.load(open(meta))["exit_code_by_key"]
    statuses = [status_by_exit_code[codes[k]] for k in codes if k in sample]
    counts = {"killed": sum(s in KILLED for s in statuses), "all": len(statuses)}
    for s in ("timeout", "survived", "no tests", "suspicious", "not checked"):
        counts[s] = statuses.count(s)
    totals[meta.removeprefix("mutants/").removesuffix(".meta")] = counts
totals["all"] = {key: sum(c[key] for c in list(totals.values())) for key in next(iter(totals.values()))}
for name, c in totals.items():
    print(f"{name:30s} killed {c['killed']:4d} / {c['all']:4d} = {100 * c['killed'] / max(c['all'], 1):5.1f}%  "
          f"(timeouts {c['timeout']}) survived {c['survived']}, no test {c['no tests']}, suspicious {c['suspicious']}, "
          f"not checked {c['not checked']}")
EOF_PY
