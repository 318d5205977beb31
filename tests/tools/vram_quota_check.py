"""vram-quota driven as an operator's script drives it: its --json output read by Python's
json module, beside real processes (ledger_worker) charging the ledger, one of them killed.

Run: python3 vram_quota_check.py VRAM_QUOTA LEDGER_WORKER  (CTest: tools.vram_quota)."""

import json
import os
import signal
import subprocess
import sys

quota, worker = sys.argv[1], sys.argv[2]
ledger = "vram-test-cli-%d" % os.getpid()
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED:", what, flush=True)


def run(*args):
    return subprocess.run([quota, *args], capture_output=True, text=True)


def listing():
    r = run("list", ledger, "--json")
    check(r.returncode == 0, "list --json succeeds: " + r.stderr)
    return json.loads(r.stdout)


def usage_of(view, tenant):
    return next(t for t in view["tenants"] if t["tenant"] == tenant)["usage"]


try:
    check(run("create", ledger).returncode == 0, "create")
    again = run("create", ledger)
    check(again.returncode == 1 and "already exists" in again.stderr, "create refuses an existing ledger")
    check(run("set", ledger, "job", "--hard", "8M").returncode == 0, "set job")
    check(run("set", ledger, "job/a", "--hard", "5M", "--soft", "4M").returncode == 0, "set job/a")
    bad = run("set", ledger, "job/a", "--hard", "five")
    check(bad.returncode == 2 and "--hard" in bad.stderr, "a bad size is a usage error naming the flag")
    missing = run("list", "vram-test-no-such-ledger")
    check(missing.returncode == 1 and "vram-test-no-such-ledger" in missing.stderr, "an unknown ledger is refused")

    view = listing()
    tenants = {t["tenant"]: t for t in view["tenants"]}
    check(set(tenants) == {"job", "job/a"}, "the tenant tree: %s" % sorted(tenants))
    check(tenants["job"]["hard"] == 8 << 20 and tenants["job"]["soft"] is None, "job's limits")
    check(tenants["job/a"]["soft"] == 4 << 20, "job/a's soft limit")

    workers = [subprocess.Popen([worker, "race", ledger, "job/a", "host", str(seed), "4000"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for seed in (1, 2, 3)]
    for w in workers:
        check(w.stdout.readline().strip() == "ready", "a worker attached")
    charged = {}
    for w in workers:
        fields = w.stdout.readline().split()
        charged[w.pid] = int(fields[1])

    view = listing()
    check(len(view["processes"]) == 3, "three processes listed")
    check(all(p["alive"] for p in view["processes"]), "all alive")
    check(usage_of(view, "job/a") == sum(charged.values()), "job/a's usage is the workers' charges")
    check(usage_of(view, "job") == usage_of(view, "job/a"), "job's usage includes job/a's")
    by_pid = {p["pid"]: p for p in view["processes"]}
    check(all(by_pid[pid]["charged"].get("job/a", 0) == c for pid, c in charged.items()),
          "each process's own charges are listed")
    check(usage_of(view, "job") <= 8 << 20 and usage_of(view, "job/a") <= 5 << 20, "within the hard limits")

    victim = workers.pop()
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    view = listing()
    check([p["alive"] for p in view["processes"] if p["pid"] == victim.pid] == [False], "the killed one shows dead")
    r = run("reclaim", ledger, "--json")
    check(r.returncode == 0 and json.loads(r.stdout)["reclaimed"] == 1, "reclaim returns one dead process")
    view = listing()
    check(len(view["processes"]) == 2, "two processes left")
    check(usage_of(view, "job/a") == sum(c for pid, c in charged.items() if pid != victim.pid),
          "the dead process's charges came back")
    check(run("check", ledger).returncode == 0, "consistent with live processes")

    for w in workers:
        w.stdin.close()
        check(w.stdout.readline().strip() == "done", "a worker finished")
        check(w.wait() == 0, "a worker exited cleanly")
    view = listing()
    check(view["processes"] == [] and usage_of(view, "job") == 0, "nothing left charged")
finally:
    r = run("remove", ledger)
    check(r.returncode == 0, "remove: " + r.stderr)

print("vram-quota: %d failures" % len(failures))
sys.exit(1 if failures else 0)
