//! What the data-parallel tests share: ranks of one run on this host.

use mxswitch::runtime::dist::Membership;

/// Runs `f` for each of `n` ranks, each on its own thread with its place in
/// a run that meets on a free localhost port; the results in rank order.
pub fn on_ranks<R: Send>(n: usize, f: impl Fn(Membership) -> R + Sync) -> Vec<R> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
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
