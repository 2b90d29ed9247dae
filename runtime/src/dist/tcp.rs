//! The CPU collective: the ranks of one host over TCP on localhost, std
//! only, so CI trains real multi-rank runs without a GPU.
//!
//! A star: rank 0 listens at the rendezvous and every other rank connects
//! and says its rank, and rank 0 answers with the world size. A sum sends
//! each rank's values to rank 0, which adds them in rank order and sends the
//! result back, so every rank gets the same bits.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::{Collective, Membership};
use crate::{Device, Error, Result, Tensor};

/// How long ranks wait for each other at the rendezvous.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(120);

/// The ranks of a CPU run, joined over TCP.
#[derive(Debug)]
pub struct TcpCollective {
    rank: usize,
    world_size: usize,
    /// Rank 0: the streams of ranks 1.. in rank order; others: rank 0's.
    peers: Vec<TcpStream>,
}

fn net(what: String, e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("{what}: {e}"))
}

/// How long rank 0 retries a rendezvous port that is in use.
const BUSY_PORT_WAIT: Duration = Duration::from_secs(3);

/// How long a rank waits between tries to reach rank 0.
const RETRY_EVERY: Duration = Duration::from_millis(20);

// Why both sides retry: a launcher finds a free port by binding it and
// letting it go. A process forked in that moment (by any thread) holds a
// copy of that probe socket until it execs. Meanwhile rank 0's bind fails
// with "in use", and a rank that connects lands in the probe's backlog and is
// reset at the exec. So rank 0 retries a busy port for a moment, and rank 0
// answers every rank with the world size, which a rank must read before it
// counts itself joined; a reset before the answer means "try again".

impl TcpCollective {
    /// Meet the other ranks at `m.rendezvous`.
    pub fn connect(m: &Membership) -> Result<TcpCollective> {
        let deadline = Instant::now() + RENDEZVOUS_TIMEOUT;
        let peers = if m.rank == 0 {
            accept_ranks(m, deadline)?
        } else {
            vec![reach_rank_0(m, deadline)?]
        };
        for p in &peers {
            p.set_nodelay(true)
                .map_err(|e| net("setting up a rank's connection".into(), e))?;
        }
        Ok(TcpCollective {
            rank: m.rank,
            world_size: m.world_size,
            peers,
        })
    }
}

/// Rank 0's listener at `addr`, retrying a busy port for a moment.
fn listen(addr: &str) -> Result<TcpListener> {
    let deadline = Instant::now() + BUSY_PORT_WAIT;
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(RETRY_EVERY)
            }
            Err(e) => return Err(net(format!("rank 0 cannot listen at {addr}"), e)),
        }
    }
}

/// Rank 0: the streams of ranks 1.. in rank order, each answered with the
/// world size.
fn accept_ranks(m: &Membership, deadline: Instant) -> Result<Vec<TcpStream>> {
    let addr = &m.rendezvous;
    let listener = listen(addr)?;
    listener
        .set_nonblocking(true)
        .map_err(|e| net(format!("listening at {addr}"), e))?;
    let mut slots: Vec<Option<TcpStream>> = (1..m.world_size).map(|_| None).collect();
    while slots.iter().any(Option::is_none) {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false)
                    .map_err(|e| net("a rank's connection".into(), e))?;
                let mut b = [0u8; 8];
                s.read_exact(&mut b)
                    .map_err(|e| net("a rank connected but did not say its rank".into(), e))?;
                let r = u64::from_le_bytes(b) as usize;
                let Some(slot @ None) = slots.get_mut(r.wrapping_sub(1)) else {
                    return Err(Error::Backend(format!(
                        "rank {r} joined the rendezvous at {addr} twice or is out of range"
                    )));
                };
                s.write_all(&(m.world_size as u64).to_le_bytes())
                    .map_err(|e| net(format!("answering rank {r}"), e))?;
                *slot = Some(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let missing: Vec<String> = slots
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.is_none())
                        .map(|(i, _)| (i + 1).to_string())
                        .collect();
                    return Err(Error::Backend(format!(
                        "rank(s) {} did not join the rendezvous at {addr} within {} s",
                        missing.join(", "),
                        RENDEZVOUS_TIMEOUT.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(net(format!("accepting ranks at {addr}"), e)),
        }
    }
    Ok(slots.into_iter().flatten().collect())
}

/// A rank above 0: its stream to rank 0, once rank 0 has answered with a
/// world size equal to this rank's.
fn reach_rank_0(m: &Membership, deadline: Instant) -> Result<TcpStream> {
    let (addr, rank) = (&m.rendezvous, m.rank);
    loop {
        match greet(addr, rank, deadline) {
            Ok((s, world)) if world == m.world_size as u64 => return Ok(s),
            Ok((_, world)) => {
                return Err(Error::Backend(format!(
                    "rank 0 at {addr} runs {world} ranks but rank {rank} was started as one of {}",
                    m.world_size
                )))
            }
            Err(e) if Instant::now() > deadline => {
                return Err(net(format!("rank {rank} cannot reach rank 0 at {addr}"), e))
            }
            Err(_) => std::thread::sleep(RETRY_EVERY),
        }
    }
}

/// One try: connect, say the rank, read rank 0's world size.
fn greet(addr: &str, rank: usize, deadline: Instant) -> std::io::Result<(TcpStream, u64)> {
    let mut s = TcpStream::connect(addr)?;
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
    s.write_all(&(rank as u64).to_le_bytes())?;
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    s.set_read_timeout(None)?;
    Ok((s, u64::from_le_bytes(b)))
}

/// Sends a length-prefixed block of f32 values.
fn send(s: &mut TcpStream, v: &[f32], to: usize) -> Result<()> {
    let mut bytes = Vec::with_capacity(8 + v.len() * 4);
    bytes.extend_from_slice(&(v.len() as u64).to_le_bytes());
    for x in v {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    s.write_all(&bytes)
        .map_err(|e| net(format!("sending to rank {to} (did it stop?)"), e))
}

/// Receives a block of `n` f32 values from rank `from`.
fn recv(s: &mut TcpStream, n: usize, from: usize) -> Result<Vec<f32>> {
    let lost = |e| net(format!("receiving from rank {from} (did it stop?)"), e);
    let mut len = [0u8; 8];
    s.read_exact(&mut len).map_err(lost)?;
    let got = u64::from_le_bytes(len) as usize;
    if got != n {
        return Err(Error::Backend(format!(
            "rank {from} sent {got} values where {n} were expected: the ranks run different models or steps"
        )));
    }
    let mut bytes = vec![0u8; n * 4];
    s.read_exact(&mut bytes).map_err(lost)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn device(&self) -> Device {
        Device::Cpu
    }

    fn all_reduce_sum(&mut self, t: &Tensor) -> Result<Tensor> {
        let mut v = t.to_vec_f32()?;
        let n = v.len();
        if self.rank == 0 {
            for (i, p) in self.peers.iter_mut().enumerate() {
                for (acc, x) in v.iter_mut().zip(recv(p, n, i + 1)?) {
                    *acc += x;
                }
            }
            for (i, p) in self.peers.iter_mut().enumerate() {
                send(p, &v, i + 1)?;
            }
        } else {
            send(&mut self.peers[0], &v, 0)?;
            v = recv(&mut self.peers[0], n, 0)?;
        }
        Tensor::from_vec(v, t.dims(), &Device::Cpu)
    }
}
