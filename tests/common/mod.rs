//! What the data-parallel tests share: ranks of one run on this host.

use mxswitch::runtime::dist::Membership;

/// A free localhost port for one run's rendezvous, below the kernel's
/// ephemeral range (32768 and up on Linux). A port from that range, found
/// with bind(0) and released, can go to another test's outgoing connection
/// before rank 0 listens on it ("Address already in use"); ports below it
/// are handed out in turn from a start that differs per process, each
/// checked free.
fn rendezvous_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    const SPAN: u16 = 2000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 1000) as u16 * 10;
    for _ in 0..SPAN {
        let port = start + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free localhost port in {start}..{}", start + SPAN);
}

/// Runs `f` for each of `n` ranks, each on its own thread with its place in
/// a run that meets on a free localhost port; the results in rank order.
pub fn on_ranks<R: Send>(n: usize, f: impl Fn(Membership) -> R + Sync) -> Vec<R> {
    let port = rendezvous_port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let f = &f;
                s.spawn(move || {
                    f(Membership {
                        rank,
                        world_size: n,
                        local_rank: rank,
                        rendezvous: format!("127.0.0.1:{port}"),
                        nccl_id: None,
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
