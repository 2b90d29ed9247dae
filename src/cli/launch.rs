//! `mxswitch launch`: one process per device, every rank's output shown.
//!
//! The launcher runs `N` copies of this binary with the command after `--`,
//! tells each its rank through the environment (SPEC section 9), prefixes
//! every line a rank prints with `[rank k]`, and stops all ranks when one
//! fails. It fixes the two bugs of the production runner it replaces: only
//! rank 0's output reached the console (a crash on rank 2 printed nothing),
//! and the runner overwrote the caller's HIP_VISIBLE_DEVICES. Here the
//! device variables are never written: rank k takes ordinal k among the
//! devices the caller's variable leaves visible.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mxswitch::runtime::dist::{env as dist_env, unique_id_hex};
use mxswitch::runtime::{Error, Result};

/// Arguments of `mxswitch launch`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each rank gets MXSWITCH_RANK, MXSWITCH_WORLD_SIZE, MXSWITCH_LOCAL_RANK and \
MXSWITCH_RENDEZVOUS (127.0.0.1:PORT, rank 0 listens); with --device cuda or rocm also \
MXSWITCH_NCCL_ID, the communicator's unique id. NCCL_NVLS_ENABLE=0 is set unless the caller \
set it; for a CPU command RAYON_NUM_THREADS is cores / N unless the caller set it. CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES are passed on untouched: rank k uses \
the k-th visible device. `{rank}` in an argument becomes the rank's number.")]
pub struct LaunchArgs {
    /// Number of processes (ranks), one per device.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub nproc: u32,
    /// Show only these ranks' output, e.g. `0` or `0,3` [default: all]. A
    /// failing rank's last lines are shown whatever this says.
    #[arg(long, value_name = "RANKS", value_delimiter = ',')]
    pub show: Option<Vec<u32>>,
    /// Port of the rendezvous on 127.0.0.1 [default: a free one].
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// The mxswitch command each rank runs, e.g. `train --config flux-small --device cuda`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Lines of a hidden rank kept, to show if that rank is the one that fails.
const KEPT_LINES: usize = 40;
/// How often the launcher looks for a rank that exited.
const POLL: Duration = Duration::from_millis(20);

pub fn run(args: &LaunchArgs) -> Result<ExitCode> {
    let n = args.nproc as usize;
    if let Some(bad) = args.show.iter().flatten().find(|&&r| r as usize >= n) {
        return Err(Error::InvalidOption(format!(
            "--show {bad}: there are only ranks 0..{} with --nproc {n}",
            n - 1
        )));
    }
    let gpu = gpu_of(&args.command);
    if let Some((var, _)) = gpu {
        check_visible(var, std::env::var(var).ok().as_deref(), n)?;
    }
    let port = match args.port {
        Some(p) => p,
        None => free_port()?,
    };
    let nccl_id = match gpu {
        Some((_, platform)) => Some(unique_id_hex(platform)?),
        None => None,
    };
    let exe = std::env::current_exe()
        .map_err(|e| Error::Io(format!("cannot find the mxswitch binary to launch: {e}")))?;
    let console = Arc::new(Mutex::new(()));
    let mut ranks = Vec::with_capacity(n);
    let caller_nvls = std::env::var_os(NVLS).is_some();
    // CPU ranks share the host's cores instead of each starting a pool
    // of all of them.
    let threads = (gpu.is_none() && std::env::var_os(RAYON_THREADS).is_none()).then(|| {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        (cores / n).max(1)
    });
    for rank in 0..n {
        let place = Place { rank, n, port };
        let mut cmd = rank_command(&exe, &args.command, place, nccl_id.as_deref(), caller_nvls);
        if let Some(t) = threads {
            cmd.env(RAYON_THREADS, t.to_string());
        }
        let shown = args
            .show
            .as_ref()
            .is_none_or(|s| s.contains(&(rank as u32)));
        match cmd.spawn() {
            Ok(child) => ranks.push(Rank::watch(rank, child, shown, &console)),
            Err(e) => {
                stop(&mut ranks);
                return Err(Error::Io(format!(
                    "cannot start rank {rank} ({}): {e}",
                    exe.display()
                )));
            }
        }
    }
    let failed = wait_first_failure(&mut ranks, interrupt_flag())?;
    let Some((rank, status)) = failed else {
        for r in &mut ranks {
            r.join();
        }
        return Ok(ExitCode::SUCCESS);
    };
    // The failed rank's pipes are closed: its last lines are all printed.
    ranks[rank].join();
    if !ranks[rank].shown {
        let _guard = console.lock().unwrap_or_else(|e| e.into_inner());
        for line in ranks[rank]
            .kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            eprintln!("[rank {rank}] {line}");
        }
    }
    let stopped = stop(&mut ranks);
    let others = if stopped.is_empty() {
        String::new()
    } else {
        format!(
            "; stopped rank{} {}",
            if stopped.len() > 1 { "s" } else { "" },
            stopped
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Err(Error::Training(format!(
        "rank {rank} failed ({}){others}",
        describe(status)
    )))
}

/// The worker threads of a CPU rank (rayon's variable), unless the caller chose.
const RAYON_THREADS: &str = "RAYON_NUM_THREADS";

/// NVLink multicast (NVLS) stays off unless the caller chose.
const NVLS: &str = "NCCL_NVLS_ENABLE";

/// A rank's number, the world size and the rendezvous port.
#[derive(Clone, Copy)]
struct Place {
    rank: usize,
    n: usize,
    port: u16,
}

/// The command of one rank: `command` with `{rank}` replaced, the variables
/// of SPEC section 9 and piped output. The device variables
/// (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES) are inherited untouched.
fn rank_command(
    exe: &std::path::Path,
    command: &[String],
    p: Place,
    nccl_id: Option<&str>,
    caller_nvls: bool,
) -> Command {
    let rank = p.rank.to_string();
    let mut cmd = Command::new(exe);
    cmd.args(command.iter().map(|a| a.replace("{rank}", &rank)))
        .env(dist_env::RANK, &rank)
        .env(dist_env::WORLD_SIZE, p.n.to_string())
        .env(dist_env::LOCAL_RANK, &rank)
        .env(dist_env::RENDEZVOUS, format!("127.0.0.1:{}", p.port))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !caller_nvls {
        cmd.env(NVLS, "0");
    }
    if let Some(id) = nccl_id {
        cmd.env(dist_env::NCCL_ID, id);
    }
    cmd
}

/// The device variable and platform of a command that trains on a GPU.
fn gpu_of(command: &[String]) -> Option<(&'static str, &'static str)> {
    let device = command
        .iter()
        .position(|a| a == "--device")
        .and_then(|i| command.get(i + 1).map(String::as_str))
        .or_else(|| command.iter().find_map(|a| a.strip_prefix("--device=")))?;
    match device {
        "cuda" => Some(("CUDA_VISIBLE_DEVICES", "cuda")),
        "rocm" => Some(("HIP_VISIBLE_DEVICES", "rocm")),
        _ => None,
    }
}

/// A caller's device list (`value` of `var`) must leave a device for
/// every rank.
fn check_visible(var: &str, value: Option<&str>, n: usize) -> Result<()> {
    let Some(list) = value else {
        return Ok(());
    };
    let visible = list.split(',').filter(|s| !s.trim().is_empty()).count();
    if visible < n {
        return Err(Error::InvalidOption(format!(
            "--nproc {n}: {var}={list} leaves {visible} device(s) visible; give at least {n} or lower --nproc"
        )));
    }
    Ok(())
}

/// A port nobody listens on now, for rank 0 to listen on.
fn free_port() -> Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::Io(format!("cannot find a free port for the rendezvous: {e}")))
}

/// A running rank and the threads that print its output.
struct Rank {
    child: Child,
    shown: bool,
    readers: Vec<JoinHandle<()>>,
    /// Its last stderr lines, kept when it is hidden.
    kept: Arc<Mutex<VecDeque<String>>>,
    done: Option<ExitStatus>,
}

impl Rank {
    fn watch(rank: usize, mut child: Child, shown: bool, console: &Arc<Mutex<()>>) -> Rank {
        let kept = Arc::new(Mutex::new(VecDeque::new()));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(forward(rank, out, shown, false, console.clone(), None));
        }
        if let Some(err) = child.stderr.take() {
            let keep = (!shown).then(|| kept.clone());
            readers.push(forward(rank, err, shown, true, console.clone(), keep));
        }
        Rank {
            child,
            shown,
            readers,
            kept,
            done: None,
        }
    }

    fn join(&mut self) {
        for r in self.readers.drain(..) {
            // A reader thread only prints; its panic would have shown already.
            let _ = r.join();
        }
    }
}

/// Print each line of `src` as `[rank k] line` (whole lines, under the
/// console lock, so ranks never interleave within a line).
fn forward(
    rank: usize,
    src: impl Read + Send + 'static,
    shown: bool,
    to_stderr: bool,
    console: Arc<Mutex<()>>,
    keep: Option<Arc<Mutex<VecDeque<String>>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(src);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&buf);
            // A progress bar redraws with \r: show its latest state only.
            let line = text.trim_end_matches(['\n', '\r']);
            let line = line.rsplit('\r').next().unwrap_or(line);
            if shown {
                let _guard = console.lock().unwrap_or_else(|e| e.into_inner());
                let _ = if to_stderr {
                    writeln!(std::io::stderr(), "[rank {rank}] {line}")
                } else {
                    writeln!(std::io::stdout(), "[rank {rank}] {line}")
                };
            } else if let Some(keep) = &keep {
                let mut k = keep.lock().unwrap_or_else(|e| e.into_inner());
                if k.len() == KEPT_LINES {
                    k.pop_front();
                }
                k.push_back(line.to_string());
            }
        }
    })
}

/// How long ranks get to stop by themselves after the launcher is
/// interrupted (a Ctrl-C reaches them too, and they write a checkpoint).
const GRACE: Duration = Duration::from_secs(30);

/// Set once the launcher gets SIGINT or SIGTERM: instead of dying and
/// leaving the ranks behind, it waits for them and then stops them.
fn interrupt_flag() -> &'static AtomicBool {
    static FLAG: AtomicBool = AtomicBool::new(false);
    // Without a handler (one was set already) the default applies.
    let _ = ctrlc::set_handler(|| FLAG.store(true, Ordering::SeqCst));
    &FLAG
}

/// Wait until every rank succeeded (`None`) or one failed: the first one
/// seen failing, and how it ended.
fn wait_first_failure(
    ranks: &mut [Rank],
    interrupted: &AtomicBool,
) -> Result<Option<(usize, ExitStatus)>> {
    let mut since: Option<Instant> = None;
    loop {
        if interrupted.load(Ordering::SeqCst) {
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() > GRACE {
                let stopped = stop(ranks);
                return Err(Error::Training(format!(
                    "interrupted: stopped ranks {stopped:?} after {} s",
                    GRACE.as_secs()
                )));
            }
        }
        let mut running = false;
        for (i, r) in ranks.iter_mut().enumerate() {
            if r.done.is_some() {
                continue;
            }
            match r.child.try_wait() {
                Ok(Some(status)) => {
                    r.done = Some(status);
                    if !status.success() {
                        return Ok(Some((i, status)));
                    }
                }
                Ok(None) => running = true,
                Err(e) => return Err(Error::Io(format!("cannot watch rank {i}: {e}"))),
            }
        }
        if !running {
            return Ok(None);
        }
        std::thread::sleep(POLL);
    }
}

/// Stop every rank still running; returns their numbers.
fn stop(ranks: &mut [Rank]) -> Vec<usize> {
    let mut stopped = Vec::new();
    for (i, r) in ranks.iter_mut().enumerate() {
        if r.done.is_none() && matches!(r.child.try_wait(), Ok(None)) {
            // Killing a rank that exits meanwhile is harmless.
            let _ = r.child.kill();
            stopped.push(i);
        }
        r.done = r.child.wait().ok();
        r.join();
    }
    stopped
}

/// How a rank ended, in words.
fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return format!("killed by signal {sig}");
        }
    }
    "no exit status".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envs(cmd: &Command) -> Vec<(String, Option<String>)> {
        cmd.get_envs()
            .map(|(k, v)| {
                let s = |x: &std::ffi::OsStr| x.to_string_lossy().into_owned();
                (s(k), v.map(s))
            })
            .collect()
    }

    /// Rank k is told its place, `{rank}` is replaced, the device variables
    /// are left to the caller, and NVLS is off unless the caller set it.
    #[test]
    fn a_rank_gets_its_variables_and_keeps_the_callers() {
        let cmd_line = vec!["train".to_string(), "--out".into(), "runs/r{rank}".into()];
        let place = Place {
            rank: 1,
            n: 2,
            port: 4242,
        };
        let exe = std::path::Path::new("mxswitch");
        let cmd = rank_command(exe, &cmd_line, place, Some("ab"), false);
        let args: Vec<_> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args, ["train", "--out", "runs/r1"]);
        let e = envs(&cmd);
        let get = |k: &str| e.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.clone());
        assert_eq!(get(dist_env::RANK).as_deref(), Some("1"));
        assert_eq!(get(dist_env::WORLD_SIZE).as_deref(), Some("2"));
        assert_eq!(get(dist_env::LOCAL_RANK).as_deref(), Some("1"));
        assert_eq!(get(dist_env::RENDEZVOUS).as_deref(), Some("127.0.0.1:4242"));
        assert_eq!(get(dist_env::NCCL_ID).as_deref(), Some("ab"));
        assert_eq!(get(NVLS).as_deref(), Some("0"));
        for var in ["CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"] {
            assert!(e.iter().all(|(k, _)| k != var), "{var} must be inherited");
        }
        let cmd = rank_command(exe, &cmd_line, place, None, true);
        let e = envs(&cmd);
        assert!(e.iter().all(|(k, _)| k != NVLS && k != dist_env::NCCL_ID));
    }

    #[test]
    fn a_callers_device_list_must_hold_every_rank() {
        let var = "HIP_VISIBLE_DEVICES";
        assert!(check_visible(var, None, 8).is_ok());
        assert!(check_visible(var, Some("4,5"), 2).is_ok());
        let e = check_visible(var, Some("4,5"), 3).unwrap_err().to_string();
        assert!(
            e.contains("HIP_VISIBLE_DEVICES=4,5 leaves 2 device(s)"),
            "{e}"
        );
    }

    #[test]
    fn the_device_flag_picks_the_variable() {
        let cmd = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            gpu_of(&cmd("train --device cuda")),
            Some(("CUDA_VISIBLE_DEVICES", "cuda"))
        );
        assert_eq!(
            gpu_of(&cmd("train --device=rocm")),
            Some(("HIP_VISIBLE_DEVICES", "rocm"))
        );
        assert_eq!(gpu_of(&cmd("train --device cpu")), None);
        assert_eq!(gpu_of(&cmd("train")), None);
    }
}
