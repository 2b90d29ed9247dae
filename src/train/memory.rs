//! The memory check before training: the estimate of what a run needs
//! ([`estimate_training_bytes`]) against what the machine can give, so that
//! a config too big for it is refused with one line before anything is
//! allocated, instead of the kernel killing the process or an allocation
//! aborting it.
//!
//! Available memory: on the CPU, `MemAvailable` of /proc/meminfo, capped by
//! the headroom of every cgroup above the process (v2 `memory.max`, v1
//! `memory.limit_in_bytes`, less the usage that is not reclaimable file
//! cache); on a GPU, the device's free memory. Where it cannot be read the
//! check is skipped with a warning on stderr.
//!
//! `MXSWITCH_MEMORY_LIMIT=<bytes>` replaces what is available, on any
//! device, so that tests can force the refusal (or a pass) on any machine.

use mxswitch_models::flux::{estimate_training_bytes, format_bytes, RunConfig};
use mxswitch_runtime::{Device, Error, Result};

/// The environment variable that overrides the available bytes.
pub const MEMORY_LIMIT_ENV: &str = "MXSWITCH_MEMORY_LIMIT";

/// Refuse to train `cfg` on `device` when the estimate exceeds what is
/// available. A resumed run also holds warm-up's copy of the AdamW state.
pub fn check_memory(cfg: &RunConfig, device: Device, resuming: bool) -> Result<()> {
    let limit = std::env::var(MEMORY_LIMIT_ENV).ok();
    let available = match limit {
        Some(text) => Available::Limit(parse_limit(&text)?),
        None => available_on(device),
    };
    if let Some(warning) = check(cfg, &available, device, resuming)? {
        eprintln!("warning: {warning}");
    }
    Ok(())
}

/// What can be allocated, and where the number came from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Available {
    Host(u64),
    Device(u64),
    /// [`MEMORY_LIMIT_ENV`].
    Limit(u64),
    /// It could not be read; why.
    Unknown(String),
}

/// The check itself: an error when the estimate does not fit, a warning
/// when what is available is unknown.
fn check(
    cfg: &RunConfig,
    available: &Available,
    device: Device,
    resuming: bool,
) -> Result<Option<String>> {
    let mut estimate = estimate_training_bytes(cfg)?;
    let mut breakdown = estimate.breakdown();
    if resuming {
        // Warm-up clones the optimizer too once it holds moments.
        estimate.total = estimate.total.saturating_add(estimate.adamw);
        breakdown += &format!(", warm-up's copy of AdamW {}", format_bytes(estimate.adamw));
    }
    let (bytes, place) = match available {
        Available::Host(b) => (*b, "on the host".to_string()),
        Available::Device(b) => (*b, format!("on {device}")),
        Available::Limit(b) => (*b, format!("under {MEMORY_LIMIT_ENV}")),
        Available::Unknown(why) => {
            return Ok(Some(format!(
                "the memory check is skipped: {why}; training needs about {}",
                format_bytes(estimate.total)
            )))
        }
    };
    if estimate.total <= bytes {
        return Ok(None);
    }
    let what = match cfg.origin.as_str() {
        "" => "training".to_string(),
        name => format!("training {name}"),
    };
    Err(Error::Training(format!(
        "{what} needs about {} ({}) but {} is available {place}; use a smaller config or batch",
        format_bytes(estimate.total),
        breakdown,
        format_bytes(bytes)
    )))
}

fn parse_limit(text: &str) -> Result<u64> {
    text.trim().parse().map_err(|_| {
        Error::InvalidOption(format!(
            "{MEMORY_LIMIT_ENV} must be a whole number of bytes, got `{text}`; unset it or give bytes, e.g. 24000000000"
        ))
    })
}

fn available_on(device: Device) -> Available {
    match device.memory_info() {
        Ok(Some((free, _total))) => Available::Device(free),
        Ok(None) => match host_available(&|path| std::fs::read_to_string(path).ok()) {
            Some(bytes) => Available::Host(bytes),
            None => {
                Available::Unknown("the host's memory could not be read from /proc/meminfo".into())
            }
        },
        Err(e) => Available::Unknown(format!("the memory of {device} could not be read ({e})")),
    }
}

/// `MemAvailable`, capped by the cgroup headroom; `read` reads a file.
fn host_available(read: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    let meminfo = read("/proc/meminfo")?;
    let available = stat_value(&meminfo, "MemAvailable:")?.checked_mul(1024)?;
    let cgroups = read("/proc/self/cgroup").unwrap_or_default();
    Some(match cgroup_headroom(&cgroups, read) {
        Some(room) => room.min(available),
        None => available,
    })
}

/// The value after `key` on its line of a `key value` file (meminfo, memory.stat).
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some(key))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

/// The least headroom (limit less non-reclaimable usage) of the memory
/// cgroups named in `/proc/self/cgroup` text and of every cgroup above them;
/// `None` when no limit is set.
fn cgroup_headroom(cgroups: &str, read: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    let mut least: Option<u64> = None;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (root, limit_file, usage_file, cache_key) = if controllers.is_empty() {
            (
                "/sys/fs/cgroup",
                "memory.max",
                "memory.current",
                "inactive_file",
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                "/sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            )
        } else {
            continue;
        };
        let mut dir = path.trim_end_matches('/').to_string();
        loop {
            let file = |name: &str| read(&format!("{root}{dir}/{name}"));
            let number = |name: &str| file(name).and_then(|s| s.trim().parse::<u64>().ok());
            // v2 writes `max` for no limit, which does not parse.
            if let Some(limit) = number(limit_file) {
                let usage = number(usage_file).unwrap_or(0);
                let cache = file("memory.stat")
                    .and_then(|s| stat_value(&s, cache_key))
                    .unwrap_or(0);
                let room = limit.saturating_sub(usage.saturating_sub(cache));
                least = Some(least.map_or(room, |l| l.min(room)));
            }
            match dir.rfind('/') {
                Some(i) => dir.truncate(i),
                None => break,
            }
        }
    }
    least
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn tiny() -> RunConfig {
        RunConfig::load("flux-tiny").unwrap()
    }

    /// flux-schnell's estimate against a 22 GiB host: one line with the
    /// estimate, its parts, what is available and what to do.
    #[test]
    fn a_config_too_big_is_refused_with_one_line() {
        let cfg = RunConfig::load("flux-schnell").unwrap();
        let e = check(&cfg, &Available::Host(22 << 30), Device::Cpu, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("training flux-schnell needs about ")
                && e.contains("(parameters 44.")
                && e.contains(", gradients 44.")
                && e.contains(", AdamW m and v 88.")
                && e.contains(", activations ")
                && e.ends_with(
                    " but 22.0 GiB is available on the host; use a smaller config or batch"
                ),
            "{e}"
        );
        assert!(!e.contains('\n'));
        let e = check(&cfg, &Available::Device(80 << 30), Device::Cuda(0), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("but 80.0 GiB is available on cuda:0"), "{e}");
    }

    #[test]
    fn a_config_that_fits_passes_and_unknown_memory_warns() {
        let cfg = tiny();
        let need = estimate_training_bytes(&cfg).unwrap().total;
        assert_eq!(
            check(&cfg, &Available::Limit(need), Device::Cpu, false).unwrap(),
            None
        );
        // A resumed run also holds warm-up's copy of the moments.
        let e = check(&cfg, &Available::Limit(need), Device::Cpu, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("warm-up's copy of AdamW"), "{e}");
        let e = check(&cfg, &Available::Limit(need - 1), Device::Cpu, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("is available under {MEMORY_LIMIT_ENV}")),
            "{e}"
        );
        let w = check(
            &cfg,
            &Available::Unknown("no GPU".into()),
            Device::Cuda(0),
            false,
        )
        .unwrap()
        .unwrap();
        assert!(
            w.starts_with("the memory check is skipped: no GPU; training needs about"),
            "{w}"
        );
    }

    /// `check_memory` itself on this machine: flux-tiny fits anywhere the
    /// tests run, and a batch of 256 latents of 1024x1024 (256 TiB of
    /// attention scores) fits nowhere.
    #[test]
    fn check_memory_reads_this_machine() {
        if std::env::var_os(MEMORY_LIMIT_ENV).is_some() {
            return;
        }
        check_memory(&tiny(), Device::Cpu, false).unwrap();
        let mut huge = tiny();
        huge.data.batch = 256;
        huge.data.latent_height = 1024;
        huge.data.latent_width = 1024;
        let e = check_memory(&huge, Device::Cpu, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is available on the host"), "{e}");
    }

    /// Without a GPU the device's memory is unknown, and the check says so.
    #[test]
    fn no_gpu_means_the_check_is_skipped_visibly() {
        if Device::Cuda(0).is_available() {
            eprintln!("skipped: this machine has a GPU");
            return;
        }
        let Available::Unknown(why) = available_on(Device::Cuda(0)) else {
            panic!("no GPU, yet its memory was read");
        };
        assert!(
            why.starts_with("the memory of cuda:0 could not be read ("),
            "{why}"
        );
    }

    /// With a GPU: its free memory is read, and flux-schnell (317 GiB) is
    /// refused on any card that exists today. Run on the GPU machine with
    /// `-- --ignored`.
    #[test]
    #[ignore = "needs a GPU"]
    fn gpu_free_memory_is_read() {
        let (free, total) = Device::Cuda(0).memory_info().unwrap().unwrap();
        assert!(0 < free && free <= total, "{free} of {total}");
        let Available::Device(bytes) = available_on(Device::Cuda(0)) else {
            panic!("the GPU's memory was not read");
        };
        assert!(bytes <= total);
        let cfg = RunConfig::load("flux-schnell").unwrap();
        let e = check(&cfg, &Available::Device(bytes), Device::Cuda(0), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is available on cuda:0"), "{e}");
        eprintln!("{e}");
        check(&tiny(), &Available::Device(bytes), Device::Cuda(0), false).unwrap();
    }

    #[test]
    fn the_limit_variable_must_be_bytes() {
        assert_eq!(parse_limit(" 1024\n").unwrap(), 1024);
        let e = parse_limit("12G").unwrap_err().to_string();
        assert!(
            e.contains("MXSWITCH_MEMORY_LIMIT must be a whole number of bytes, got `12G`"),
            "{e}"
        );
    }

    fn fake(files: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = files
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |path| map.get(path).cloned()
    }

    /// The least headroom over the cgroup and its parents, v1 and v2, with
    /// reclaimable file cache counted as free.
    #[test]
    fn cgroup_limits_cap_mem_available() {
        let meminfo = ("/proc/meminfo", "MemTotal: 100 kB\nMemAvailable:  64 kB\n");
        let v2 = fake(&[
            meminfo,
            ("/proc/self/cgroup", "0::/a/b\n"),
            ("/sys/fs/cgroup/a/b/memory.max", "max\n"),
            ("/sys/fs/cgroup/a/memory.max", "50000\n"),
            ("/sys/fs/cgroup/a/memory.current", "30000\n"),
            (
                "/sys/fs/cgroup/a/memory.stat",
                "anon 1\ninactive_file 5000\n",
            ),
        ]);
        assert_eq!(host_available(&v2), Some(25_000));
        let v1 = fake(&[
            meminfo,
            ("/proc/self/cgroup", "4:memory:/x\n0::/\n"),
            (
                "/sys/fs/cgroup/memory/x/memory.limit_in_bytes",
                "9223372036854771712",
            ),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "200000"),
            ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "190000"),
        ]);
        assert_eq!(host_available(&v1), Some(10_000));
        let unlimited = fake(&[meminfo, ("/proc/self/cgroup", "0::/\n")]);
        assert_eq!(host_available(&unlimited), Some(64 * 1024));
        assert_eq!(host_available(&fake(&[])), None);
    }
}
