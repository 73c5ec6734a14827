"""Session-32 GPU driver: calibrate, then countdown-only SFT (A) -> mixed SFT (B) -> distill student (C).

Each phase's step count is sized from measured steps/s so the whole run fits BUDGET seconds; each phase
runs under a timeout and is exported from its latest checkpoint if stopped. Exports land in $OUT as tars.
"""
import csv, json, os, shutil, subprocess, sys, tarfile, time
from pathlib import Path

T0 = time.time()
BUDGET = float(os.environ.get("BUDGET", "540"))
OUT = Path(os.environ.get("OUT", "runs/s32gpu/out"))
OUT.mkdir(parents=True, exist_ok=True)
PY = [sys.executable, "-m", "dllm", "train"]
R = "runs/s32gpu"
THREADS = os.environ.get("THREADS", "4")
LOG = open(OUT / "driver.log", "a")
WHOLE = "recipes/resume/tiny-sft-cd-whole-s31"
LISTS6 = ("data.suite_options.lists.ops=[copy, reverse, sort, insert, remove, replace, shuffle, shuffle, shuffle, "
          "replace_random, replace_random, replace_random, replace_random, replace_random, replace_random, "
          "replace_random, replace_random]")
LISTS17 = ("data.suite_options.lists.ops=[copy, copy, copy, reverse, sort, sort, insert, insert, insert, remove, "
           "replace, shuffle, replace_random]")
SFT_COMMON = ["--config", "recipes/tiny-sft.yaml", f"num_threads={THREADS}", "prefix_prob=0.7", "t_min=0.0",
              "full_mask_prob=0.25", "result_mask_prob=0.8", "mixed_precision=no", "token_weight_gamma=1.0",
              "progress=false", "save_every=250", "keep_checkpoints=2"]
CD_ONLY = ["data.tasks.arith=0", "data.tasks.lists=0", "data.tasks.gsm=0", "data.tasks.sudoku=0",
           "data.tasks.countdown=12.0"]
MIX = ["data.tasks.arith=4.0", "data.tasks.lists=6.0", "data.tasks.gsm=3.0", "data.tasks.sudoku=1.0",
       "data.tasks.countdown=12.0", LISTS17]


def log(msg):
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.write(line + "\n"); LOG.flush()


def a_args(run, steps, seed=46):
    return ["sft", *SFT_COMMON, *CD_ONLY, f"run_dir={run}", f"export_dir={run}/final", f"model.path={WHOLE}",
            "optim.lr=3e-4", "optim.warmup_steps=50", f"seed={seed}", f"max_steps={steps}", "eval_every=1000",
            "eval_examples=64"]


def b_args(run, steps, src):
    return ["sft", *SFT_COMMON, *MIX, f"run_dir={run}", f"export_dir={run}/final", f"model.path={src}",
            "optim.lr=1e-4", "optim.warmup_steps=50", "seed=47", f"max_steps={steps}", "eval_every=1000",
            "eval_examples=64"]


def c_args(run, steps, teacher):
    return ["distill", "--config", "recipes/tiny-d2f.yaml", f"teacher={teacher}", "model.path=tiny-d2f",
            f"model.tokenizer={WHOLE}", "model.tag_head=unk", f"run_dir={run}", f"export_dir={run}/final",
            f"max_steps={steps}", "optim.lr=1.5e-4", "optim.warmup_steps=50", "data.tasks.lists=4.0",
            "data.tasks.gsm=8.0", "data.tasks.sudoku=3.0", "data.tasks.countdown=32.0", "save_every=250",
            "mixed_precision=no", f"num_threads={THREADS}", "seed=48", "progress=false", LISTS6]


def run(args, timeout):
    log("run " + " ".join(args[:1] + [a for a in args if a.startswith(("run_dir", "max_steps", "model.path", "teacher"))]))
    with open(OUT / "train.log", "a") as f:
        f.write(f"\n==== {' '.join(args)}\n"); f.flush()
        p = subprocess.Popen(PY + args, stdout=f, stderr=subprocess.STDOUT)
        try:
            rc = p.wait(timeout=max(5, timeout))
        except subprocess.TimeoutExpired:
            log("timeout: SIGTERM"); p.terminate()
            try:
                rc = p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill(); rc = p.wait()
            return "stopped"
    log(f"rc={rc}")
    if rc != 0:
        os.system(f"tail -30 {OUT}/train.log")
        raise SystemExit(f"phase failed rc={rc}")
    return "done"


def latest_step(rundir):
    steps = sorted(int(p.name.split("-")[1]) for p in (Path(rundir) / "checkpoints").glob("step-*"))
    return steps[-1] if steps else 0


def finish(args, state, rundir):
    if state == "stopped":
        s = latest_step(rundir)
        log(f"export stopped run at checkpoint {s}")
        args = [a for a in args if not a.startswith("max_steps=")] + [f"max_steps={s}", "--resume"]
        run(args, 120)
    return f"{rundir}/final"


def steps_per_s(rundir, tokens=True):
    rows = list(csv.DictReader(open(Path(rundir) / "metrics.csv")))
    tok_per_step = float(rows[-1]["tokens_seen"]) / int(rows[-1]["step"])
    rows = rows[1:] if len(rows) > 1 else rows  # first window includes warm-up
    tps = sum(float(r["tokens_per_s"]) for r in rows) / len(rows)
    return tps / tok_per_step


def pack(src, name):
    if not Path(src).exists():
        return
    with tarfile.open(OUT / name, "w") as t:
        t.add(src, arcname=name.replace(".tar", ""))
    log(f"packed {name} {os.path.getsize(OUT / name) / 1e6:.1f} MB")


def pack_logs():
    with tarfile.open(OUT / "logs.tar.gz", "w:gz") as t:
        for d in Path(R).glob("*"):
            if d.is_dir() and d.name != "out":
                for f in ("metrics.csv", "eval.csv", "config.yaml"):
                    if (d / f).exists():
                        t.add(d / f, arcname=f"{d.name}/{f}")


try:
    import torch
    log(f"torch {torch.__version__} cuda {torch.cuda.is_available()} {torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''}")
    # calibration
    t = time.time(); run(a_args(f"{R}/calA", int(os.environ.get("CAL_A", "120")), seed=99) + ["eval_every=0", "save_every=1000"], 200)
    wa = time.time() - t; ra = steps_per_s(f"{R}/calA")
    t = time.time(); run(c_args(f"{R}/calC", int(os.environ.get("CAL_C", "60")), WHOLE) + ["save_every=1000"], 200)
    wc = time.time() - t; rc_ = steps_per_s(f"{R}/calC")
    log(f"calibration: sft {ra:.1f} steps/s (wall {wa:.0f}s), distill {rc_:.1f} steps/s (wall {wc:.0f}s)")
    json.dump({"sft_steps_per_s": ra, "distill_steps_per_s": rc_}, open(OUT / "calib.json", "w"))
    overhead = 25.0  # process start, model load, export per phase
    left = BUDGET - (time.time() - T0) - 3 * overhead - 30
    mix_rate = ra * float(os.environ.get("MIX_SLOWDOWN", "0.6"))
    na = int(min(12000, max(500, 0.42 * left * ra)))
    nb = int(min(3000, max(300, 0.20 * left * mix_rate)))
    nc = int(min(5000, max(200, 0.38 * left * rc_)))
    if os.environ.get("SMOKE"):
        na, nb, nc = 30, 20, 10
    log(f"plan: A {na} steps, B {nb} steps, C {nc} steps ({left:.0f}s left)")
    ta = time.time(); A = f"{R}/A"; st = run(a_args(A, na), 0.42 * left * 1.25 + overhead)
    srcA = finish(a_args(A, na), st, A); log(f"A took {time.time() - ta:.0f}s")
    pack(srcA, "A.tar")
    left = BUDGET - (time.time() - T0) - 2 * overhead - 30
    nb = int(min(nb, max(min(nb, 200), 0.35 * left * mix_rate)))
    tb = time.time(); B = f"{R}/B"; st = run(b_args(B, nb, srcA), 0.35 * left * 1.3 + overhead)
    srcB = finish(b_args(B, nb, srcA), st, B); log(f"B took {time.time() - tb:.0f}s")
    pack(srcB, "B.tar")
    left = BUDGET - (time.time() - T0) - overhead - 25
    nc = int(min(nc, max(min(nc, 100), left * rc_ * 0.95)))
    tc = time.time(); C = f"{R}/C"; st = run(c_args(C, nc, srcB), left + 10)
    srcC = finish(c_args(C, nc, srcB), st, C); log(f"C took {time.time() - tc:.0f}s")
    pack(srcC, "C.tar")
finally:
    pack_logs()
    log("end")
