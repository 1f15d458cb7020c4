//! Data parallelism: the collective operations that ranks of one run share,
//! and the world this process belongs to.
//!
//! Every rank runs the same recipe over the same data in the same order and
//! takes its shard of every batch (`shard`). The run core sums the ranks'
//! gradients, weighted by their share of the global batch, with one
//! all-reduce per step, and agrees on OOMs before it (`run::Recovery`).
//! Collectives run on existing engines, never a home-made transport: MPI for
//! CPU processes (`--features mpi`, [`mpi`]).
//!
//! A collective that does not complete within the world's timeout (a rank
//! died or hangs), or during which this process is asked to stop (a signal:
//! `mpirun` sends SIGTERM to the others when a rank dies), fails with
//! [`Error::Peer`]: the run stops with its checkpoint, since no parameter
//! changes before the step's collectives complete.

pub mod launch;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;

use std::sync::OnceLock;
use std::time::Duration;

use candle_core::{DType, Tensor};

use crate::{Error, Result};

/// How long a collective waits for the other ranks unless told
/// (`--rank-timeout`): long enough for a slow rank's step.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Whether this process was asked to stop, and by which signal
/// (`run::interrupt::requested`): a collective waiting on others gives up
/// then, with `Error::Interrupted`.
pub type StopCheck = fn() -> Option<i32>;

/// The operations a data-parallel run needs, over every rank of the world.
/// Each call must be made by every rank, in the same order.
pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// The engine and world, for messages and records: `MPI (Open MPI 4.1.4), 4 ranks`.
    fn describe(&self) -> String;
    /// Sums `buf` element-wise over the ranks, in place on every rank.
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()>;
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()>;
    /// Replaces `buf` on every rank with `root`'s bytes (any length).
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<()>;
    fn barrier(&self) -> Result<()>;
    /// A barrier that a stop request does not end, waiting at most
    /// `limit`: ranks stopped by a signal leave together, after rank 0
    /// wrote its checkpoint (mpirun kills the others a second after the
    /// first one exits).
    fn farewell(&self, limit: Duration) -> Result<()>;
    /// Sums a tensor over the ranks (the step's gradient bucket). By
    /// default through the host in f32; NCCL keeps it on the device.
    fn all_reduce_sum_tensor(&self, t: &Tensor) -> Result<Tensor> {
        host_all_reduce(self, t)
    }
}

/// [`Collective::all_reduce_sum_tensor`] through host memory.
pub fn host_all_reduce<C: Collective + ?Sized>(w: &C, t: &Tensor) -> Result<Tensor> {
    let (shape, device, dtype) = (t.shape().clone(), t.device().clone(), t.dtype());
    let mut host = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    w.all_reduce_sum_f32(&mut host)?;
    Ok(Tensor::from_vec(host, shape, &device)?.to_dtype(dtype)?)
}

/// One process alone: every operation is the identity. The run core uses
/// the single-process path when there is no world; this is for embedders
/// and tests that want the collective path with one rank.
#[derive(Debug, Default)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn describe(&self) -> String {
        "one process".into()
    }
    fn all_reduce_sum_f32(&self, _: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn broadcast_bytes(&self, _: usize, _: &mut Vec<u8>) -> Result<()> {
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn farewell(&self, _: Duration) -> Result<()> {
        Ok(())
    }
}

static WORLD: OnceLock<Box<dyn Collective>> = OnceLock::new();

/// The world this process trains in, when it is one rank of several (or
/// was started by a launcher); None for a plain single-process run.
pub fn world() -> Option<&'static dyn Collective> {
    WORLD.get().map(|w| &**w)
}

/// This process's rank, 0 when not distributed.
pub fn rank() -> usize {
    world().map_or(0, |w| w.rank())
}

/// Sets the world (once per process): what [`init`] found, or an
/// embedder's own collective.
pub fn set_world(w: Box<dyn Collective>) -> Result<()> {
    WORLD
        .set(w)
        .map_err(|_| Error::Config("the data-parallel world is already set".into()))
}

/// Which engine sums the gradients (`taper train --collective`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// MPI when a launcher started this process; else a plain process.
    #[default]
    Auto,
    /// NCCL on the GPU (`--features nccl`), over MPI's ranks when a
    /// launcher started them, else alone (world size 1).
    Nccl,
}

impl Engine {
    pub fn parse(s: &str) -> std::result::Result<Engine, String> {
        match s {
            "auto" | "mpi" => Ok(Engine::Auto),
            "nccl" => Ok(Engine::Nccl),
            other => Err(format!("`{other}`: expected auto, mpi or nccl")),
        }
    }
}

/// Joins the world a launcher started this process in (`mpirun`, `taper
/// launch`): MPI when its environment says so; with [`Engine::Nccl`], NCCL
/// sums the gradients (alone when no launcher did). None for a plain
/// single-process run. `timeout` bounds every MPI collective.
pub fn init(
    timeout: Duration,
    stop: StopCheck,
    engine: Engine,
) -> Result<Option<&'static dyn Collective>> {
    let control: Box<dyn Collective> = match launched_size() {
        None if engine == Engine::Auto => return Ok(None),
        None => Box::new(Solo),
        Some(size) => join_mpi(size, timeout, stop)?,
    };
    let w = match engine {
        Engine::Auto => control,
        Engine::Nccl => nccl_over(control)?,
    };
    set_world(w)?;
    Ok(world())
}

#[cfg(feature = "mpi")]
fn join_mpi(size: usize, timeout: Duration, stop: StopCheck) -> Result<Box<dyn Collective>> {
    let w = mpi::Mpi::init(timeout, stop)?;
    if w.size() != size {
        return Err(Error::Config(format!(
            "the launcher says {size} ranks, MPI says {}",
            w.size()
        )));
    }
    Ok(Box::new(w))
}

#[cfg(not(feature = "mpi"))]
fn join_mpi(size: usize, _: Duration, _: StopCheck) -> Result<Box<dyn Collective>> {
    Err(Error::Config(format!(
        "started as one of {size} MPI ranks, but this taper was built without MPI: build it with `--features mpi` (Debian: libopenmpi-dev, libclang-dev)"
    )))
}

#[cfg(feature = "nccl")]
fn nccl_over(control: Box<dyn Collective>) -> Result<Box<dyn Collective>> {
    Ok(Box::new(nccl::Nccl::new(control)?))
}

#[cfg(not(feature = "nccl"))]
fn nccl_over(_: Box<dyn Collective>) -> Result<Box<dyn Collective>> {
    Err(Error::Config(
        "--collective nccl: this taper was built without NCCL: build it with `--features nccl` (and CUDA)".into(),
    ))
}

/// Ends the world after a run that completed on every rank (MPI_Finalize).
/// After a failure nothing is called: a rank may be gone.
pub fn finish() {
    #[cfg(feature = "mpi")]
    mpi::finish();
}

/// The world size an MPI launcher set in the environment (Open MPI, or the
/// PMI of MPICH and Slurm).
fn launched_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
}

/// The rows `[start, start + len)` of a batch of `n` that `rank` of `size`
/// trains on: contiguous shards whose sizes differ by at most one, the
/// first ranks taking the remainder. A rank may get none (`n < size`).
pub fn shard(n: usize, rank: usize, size: usize) -> (usize, usize) {
    let base = n / size;
    let extra = n % size;
    let start = rank * base + rank.min(extra);
    (start, base + usize::from(rank < extra))
}

/// The error for a collective that did not complete.
pub fn peer_error(op: &str, why: &str) -> Error {
    Error::Peer(format!(
        "rank {}: {op} did not complete: {why}; stopping (another rank died, hung or stopped)",
        rank()
    ))
}

#[cfg(test)]
mod tests {
    use super::shard;

    #[test]
    fn shards_cover_the_batch_once_in_order() {
        for n in 0..20 {
            for size in 1..6 {
                let mut next = 0;
                for r in 0..size {
                    let (start, len) = shard(n, r, size);
                    assert_eq!(start, next, "n={n} size={size} rank={r}");
                    assert!(len == n / size || len == n / size + 1);
                    next += len;
                }
                assert_eq!(next, n);
            }
        }
    }
}
