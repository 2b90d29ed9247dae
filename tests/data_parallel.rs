//! Data parallelism on the CPU (SPEC section 9): the TCP collective,
//! `mxswitch launch` (every rank's output under its prefix, a failing rank
//! that stops the others) and training over two ranks that matches one
//! process at the same global batch.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use mxswitch::runtime::dist::tcp::TcpCollective;
use mxswitch::runtime::dist::{
    all_gather_bytes, all_reduce_f32, average_gradients, backward_averaged, Collective, Membership,
    BUCKET_BYTES,
};
use mxswitch::runtime::{DType, Device, Gradients, Param, ParamId, Tensor};

mod common;

/// `n` ranks joined over TCP, each running `f`; their results in rank order.
fn ranks<R: Send>(n: usize, f: impl Fn(&mut dyn Collective) -> R + Sync) -> Vec<R> {
    common::on_ranks(n, |m| f(&mut TcpCollective::connect(&m).unwrap()))
}

#[test]
fn sums_and_gathers_over_three_ranks() {
    let got = ranks(3, |c| {
        let r = c.rank() as f32;
        let sum = all_reduce_f32(c, &[r, 10.0 * r, 0.5]).unwrap();
        let me = c.rank() as u8;
        let all = all_gather_bytes(c, &[me, 200 + me]).unwrap();
        (sum, all)
    });
    for (sum, all) in got {
        assert_eq!(sum, vec![3.0, 30.0, 1.5]);
        assert_eq!(all, vec![vec![0, 200], vec![1, 201], vec![2, 202]]);
    }
}

/// Averaged gradients are the mean of every rank's, in any bucket size,
/// with their shapes and dtypes kept.
#[test]
fn gradients_average_in_buckets() {
    let ids: Vec<ParamId> = (0..3)
        .map(|_| {
            Param::new(Tensor::zeros([1], DType::F32, &Device::Cpu).unwrap())
                .unwrap()
                .id()
        })
        .collect();
    for bucket_bytes in [4, 40, BUCKET_BYTES] {
        let got = ranks(2, |c| {
            let k = c.rank() as f32 + 1.0;
            let mut g = Gradients::default();
            let shapes: [&[usize]; 3] = [&[2, 3], &[4], &[1, 1, 5]];
            for (id, dims) in ids.iter().zip(shapes) {
                let n: usize = dims.iter().product();
                let v: Vec<f32> = (0..n).map(|i| k * i as f32).collect();
                g.insert(*id, Tensor::from_vec(v, dims, &Device::Cpu).unwrap());
            }
            average_gradients(c, &mut g, &ids, bucket_bytes).unwrap();
            ids.iter()
                .map(|id| {
                    let t = g.get(*id).unwrap();
                    (t.dims().to_vec(), t.to_vec_f32().unwrap())
                })
                .collect::<Vec<_>>()
        });
        for per_rank in &got {
            assert_eq!(per_rank, &got[0]);
            for (dims, v) in per_rank {
                let n: usize = dims.iter().product();
                let want: Vec<f32> = (0..n).map(|i| 1.5 * i as f32).collect();
                assert_eq!(v, &want, "bucket {bucket_bytes}");
            }
        }
    }
}

/// Backward with the buckets summed as the gradients become final gives
/// every rank the mean of the ranks' gradients, in any bucket size.
#[test]
fn backward_averages_while_it_runs() {
    for bucket_bytes in [4, BUCKET_BYTES] {
        let got = ranks(2, |c| {
            let k = c.rank() as f32 + 1.0;
            let p = Param::new(Tensor::zeros([3], DType::F32, &Device::Cpu).unwrap()).unwrap();
            let q = Param::new(Tensor::zeros([2, 2], DType::F32, &Device::Cpu).unwrap()).unwrap();
            let x = Tensor::from_vec(vec![k; 3], [3], &Device::Cpu).unwrap();
            let y = Tensor::from_vec(vec![2.0 * k; 4], [2, 2], &Device::Cpu).unwrap();
            let loss = p
                .mul(&x)
                .unwrap()
                .sum(&[0], false)
                .unwrap()
                .add(&q.mul(&y).unwrap().sum(&[0, 1], false).unwrap())
                .unwrap();
            let g = backward_averaged(c, &loss, bucket_bytes).unwrap();
            let v = |t: &Param| g.get(t.id()).unwrap().to_vec_f32().unwrap();
            (v(&p), v(&q), g.len())
        });
        for (p, q, n) in got {
            assert_eq!(
                (p, q, n),
                (vec![1.5; 3], vec![3.0; 4], 2),
                "bucket {bucket_bytes}"
            );
        }
    }
}

/// A gradient of a parameter outside the given order is refused instead of
/// being left unsummed on one rank.
#[test]
fn a_stray_gradient_is_refused() {
    let p = Param::new(Tensor::zeros([1], DType::F32, &Device::Cpu).unwrap()).unwrap();
    let errs = ranks(1, |c| {
        let mut g = Gradients::default();
        g.insert(
            p.id(),
            Tensor::zeros([1], DType::F32, &Device::Cpu).unwrap(),
        );
        average_gradients(c, &mut g, &[], BUCKET_BYTES)
            .unwrap_err()
            .to_string()
    });
    assert!(errs[0].contains("only 0 of them"), "{}", errs[0]);
}

/// The place of `rank` in a run of `world_size` ranks that meets at `addr`.
fn member(rank: usize, world_size: usize, addr: std::net::SocketAddr) -> Membership {
    Membership {
        rank,
        world_size,
        local_rank: rank,
        rendezvous: addr.to_string(),
        nccl_id: None,
    }
}

/// The rendezvous survives a copy of a launcher's port probe that a forked
/// child holds until it execs: rank 0 waits out the busy port, and a rank
/// that reached the probe instead of rank 0 is reset and tries again.
#[test]
fn the_rendezvous_waits_out_a_stale_probe_socket() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    let sums = std::thread::scope(|s| {
        let rank1 = s.spawn(|| {
            let mut c = TcpCollective::connect(&member(1, 2, addr)).unwrap();
            all_reduce_f32(&mut c, &[2.0]).unwrap()
        });
        let rank0 = s.spawn(|| {
            let mut c = TcpCollective::connect(&member(0, 2, addr)).unwrap();
            all_reduce_f32(&mut c, &[1.0]).unwrap()
        });
        std::thread::sleep(Duration::from_millis(300));
        drop(probe);
        [rank0.join().unwrap(), rank1.join().unwrap()]
    });
    assert_eq!(sums, [vec![3.0], vec![3.0]]);
}

/// A port that stays busy, and a rank started for another world size, are
/// refused with one-line errors.
#[test]
fn a_busy_port_or_another_world_size_is_refused() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let err = TcpCollective::connect(&member(0, 1, held.local_addr().unwrap()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("rank 0 cannot listen at"), "{err}");
    assert!(err.contains("in use") && !err.contains('\n'), "{err}");

    let addr = held.local_addr().unwrap();
    drop(held);
    let err = std::thread::scope(|s| {
        s.spawn(|| TcpCollective::connect(&member(0, 2, addr)));
        TcpCollective::connect(&member(1, 3, addr)).unwrap_err()
    })
    .to_string();
    assert_eq!(
        err,
        format!("rank 0 at {addr} runs 2 ranks but rank 1 was started as one of 3")
    );
}

fn mxswitch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mxswitch"))
        .args(args)
        .env_remove("MXSWITCH_WORLD_SIZE")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn every_rank_is_shown_under_its_prefix_or_the_chosen_ones() {
    let out = mxswitch(&[
        "launch",
        "--nproc",
        "3",
        "--",
        "plan",
        "--config",
        "flux-tiny",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for rank in 0..3 {
        let prefix = format!("[rank {rank}] ");
        assert!(stdout.lines().any(|l| l.starts_with(&prefix)), "{stdout}");
    }
    assert!(stdout.lines().all(|l| l.starts_with("[rank ")), "{stdout}");
    // Each rank printed the whole plan.
    let count = |r: &str| stdout.lines().filter(|l| l.starts_with(r)).count();
    assert_eq!(count("[rank 0]"), count("[rank 2]"));

    let out = mxswitch(&[
        "launch",
        "--nproc",
        "3",
        "--show",
        "1",
        "--",
        "plan",
        "--config",
        "flux-tiny",
    ]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert!(
        !stdout.is_empty() && stdout.lines().all(|l| l.starts_with("[rank 1] ")),
        "{stdout}"
    );

    let out = mxswitch(&[
        "launch",
        "--nproc",
        "2",
        "--show",
        "2",
        "--",
        "plan",
        "--config",
        "flux-tiny",
    ]);
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr).trim(),
        "error: invalid option: --show 2: there are only ranks 0..1 with --nproc 2"
    );
}

/// Rank 1 fails at once (its config, `cfg{rank}.ron`, does not exist);
/// rank 0 waits for it at the rendezvous until the launcher stops it. The
/// error shows under rank 1's prefix though only rank 0 is shown.
#[test]
fn a_failing_rank_is_shown_and_stops_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/configs/flux-tiny.ron"),
    )
    .unwrap();
    std::fs::write(dir.path().join("cfg0.ron"), cfg).unwrap();
    let cfg_arg = dir.path().join("cfg{rank}.ron");
    let out_arg = dir.path().join("out{rank}");
    let t0 = Instant::now();
    let out = mxswitch(&[
        "launch",
        "--nproc",
        "2",
        "--show",
        "0",
        "--",
        "train",
        "--config",
        cfg_arg.to_str().unwrap(),
        "--iters",
        "100000",
        "--out",
        out_arg.to_str().unwrap(),
    ]);
    assert!(t0.elapsed() < Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("[rank 1] error: cannot read config") && l.contains("cfg1.ron")),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().last(),
        Some("error: rank 1 failed (exit status 1); stopped rank 0"),
        "{stderr}"
    );
}

/// The metrics rows of a run: (iter, loss, recipe).
fn rows(dir: &Path) -> Vec<(u64, f32, String)> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .map(|v| {
            (
                v["iter"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap() as f32,
                v["recipe"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Largest relative loss difference allowed between world sizes. The ranks
/// see the same samples and average the gradients, so the runs differ only
/// in the order of sums: a loss is a mean of per-rank means, a gradient the
/// mean of per-rank sums; these last-bit differences (FP8's per-tensor
/// amax over a rank's half batch among them) grow through the AdamW steps.
/// Measured over these 12 steps: at most 7e-6.
const LOSS_TOLERANCE: f32 = 1e-4;

fn assert_close(a: &[(u64, f32, String)], b: &[(u64, f32, String)]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!((x.0, &x.2), (y.0, &y.2), "iteration or recipe differs");
        let rel = (x.1 - y.1).abs() / x.1.abs();
        assert!(
            rel <= LOSS_TOLERANCE,
            "iteration {}: {} vs {} ({rel:e})",
            x.0,
            x.1,
            y.1
        );
    }
}

/// Two ranks at per-rank batch 2 train like one process at batch 4: same
/// losses within the bound, the switch at the same iteration on every rank,
/// only rank 0's folder written, and a resume on another world size.
#[test]
fn two_ranks_train_like_one_and_resume_on_any_world_size() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let common = ["--config", "flux-tiny", "--switch-at", "6"];
    let run = |pre: &[&str], extra: &[&str]| {
        let args: Vec<&str> = pre.iter().chain(&common).chain(extra).copied().collect();
        let out = mxswitch(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    run(&["train"], &["--iters", "12", "--out", &p("one")]);
    let launch = ["launch", "--nproc", "2", "--", "train"];
    let stdout = run(
        &launch,
        &[
            "--iters",
            "12",
            "--out",
            &p("two{rank}"),
            "--recipe-check-every",
            "1",
        ],
    );
    let one = rows(&dir.path().join("one"));
    let two = rows(&dir.path().join("two0"));
    assert_close(&one, &two);
    assert!(!dir.path().join("two1").exists(), "rank 1 wrote files");
    assert!(
        stdout.contains("[rank 1] trained iterations 0..=11: loss"),
        "{stdout}"
    );
    assert!(stdout.contains("rank 0 writes the run's files"), "{stdout}");
    for rank in 0..2 {
        let line = format!("[rank {rank}] 4/4 layers (24/24 linears) now fp8 at iteration 6");
        assert!(stdout.contains(&line), "{stdout}");
    }

    // Half the run on one process, the rest on two ranks, and the reverse.
    run(&["train"], &["--iters", "6", "--out", &p("half1")]);
    let resume = p("half1/checkpoint.safetensors");
    run(
        &launch,
        &[
            "--iters",
            "12",
            "--resume",
            &resume,
            "--out",
            &p("rest2_{rank}"),
        ],
    );
    assert_close(&one[6..], &rows(&dir.path().join("rest2_0")));
    run(&launch, &["--iters", "6", "--out", &p("half2_{rank}")]);
    let resume = p("half2_0/checkpoint.safetensors");
    run(
        &["train"],
        &["--iters", "12", "--resume", &resume, "--out", &p("rest1")],
    );
    assert_close(&one[6..], &rows(&dir.path().join("rest1")));
}

/// The sharding plan of flux-schnell on 8 GPUs: each ZeRO stage divides
/// by 8 what it shards and keeps the rest, so the totals fall stage by stage.
#[test]
fn the_plan_shards_flux_schnell_over_eight_gpus() {
    let plan = |extra: &[&str]| {
        let args = ["plan", "--config", "flux-schnell", "--world-size", "8"];
        mxswitch(&args.iter().chain(extra).copied().collect::<Vec<_>>())
    };
    let out = plan(&["--batch", "3"]);
    assert_eq!(
        text(&out.stderr).trim(),
        "error: invalid option: --world-size 8: data.batch 3 is the global batch and must split evenly over the ranks"
    );
    let out = plan(&["--batch", "8", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = v["parameters"].as_u64().unwrap();
    assert_eq!(p, 11_891_178_560);
    let stages = v["per_gpu"].as_array().unwrap();
    assert_eq!(stages.len(), 4);
    let get = |z: usize, k: &str| stages[z][k].as_u64().unwrap();
    let (full, eighth) = (4 * p, (4 * p).div_ceil(8));
    assert_eq!(
        (get(0, "parameters"), get(0, "gradients"), get(0, "adamw")),
        (full, full, 2 * full)
    );
    assert_eq!(
        (get(1, "parameters"), get(1, "gradients"), get(1, "adamw")),
        (full, full, 2 * eighth)
    );
    assert_eq!((get(2, "parameters"), get(2, "gradients")), (full, eighth));
    assert_eq!(
        (get(3, "parameters"), get(3, "warmup_copy")),
        (eighth, eighth)
    );
    assert!(get(3, "gathered") > 0 && get(2, "gathered") == 0);
    for z in 0..4 {
        let parts = [
            "parameters",
            "warmup_copy",
            "gradients",
            "adamw",
            "activations",
            "buckets",
            "gathered",
        ];
        assert_eq!(
            get(z, "total"),
            parts.iter().map(|k| get(z, k)).sum::<u64>()
        );
        assert_eq!(get(z, "activations"), get(0, "activations"));
    }
    assert!((1..4).all(|z| get(z, "total") < get(z - 1, "total")));
}
