//! The MPI world (`--features mpi`): rsmpi over the system's MPI (Open MPI
//! from Debian's libopenmpi-dev; MPICH works the same).
//!
//! Collectives are MPI's non-blocking ones (`MPI_Iallreduce`, `MPI_Ibcast`,
//! `MPI_Ibarrier`), tested until they complete so that a rank that died or
//! hangs, or a signal to this process, ends the wait instead of blocking it
//! forever. Their buffers are owned here: a collective abandoned half-way
//! leaks them, since MPI may still write into them.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use mpi::ffi;
use mpi::traits::{AsRaw, Communicator};

use super::{peer_error, Collective, StopCheck};
use crate::{Error, Result};

/// MPI's global state; dropped (MPI_Finalize) by [`finish`].
static UNIVERSE: Mutex<Option<mpi::environment::Universe>> = Mutex::new(None);

pub struct Mpi {
    rank: usize,
    size: usize,
    library: String,
    timeout: Duration,
    stop: StopCheck,
}

impl Mpi {
    /// Initializes MPI. Only the thread that trains calls it (funneled).
    pub fn init(timeout: Duration, stop: StopCheck) -> Result<Mpi> {
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or_else(|| Error::Config("MPI was already initialized".into()))?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let library = mpi::environment::library_version()
            .ok()
            .and_then(|v| {
                // "Open MPI v4.1.4, package: ...": the name and version.
                let first = v.lines().next()?.split(',').next()?;
                Some(first.trim_matches(char::from(0)).trim().to_string())
            })
            .unwrap_or_else(|| "MPI".into());
        *UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()) = Some(universe);
        Ok(Mpi {
            rank,
            size,
            library,
            timeout,
            stop,
        })
    }

    fn comm() -> ffi::MPI_Comm {
        mpi::topology::SimpleCommunicator::world().as_raw()
    }

    /// Tests `req` until it completes, the timeout passes or a signal asks
    /// this process to stop. The sleeps between tests grow to 1 ms: a rank
    /// waiting for a slower one leaves it the cores.
    fn wait(&self, op: &str, req: ffi::MPI_Request) -> Result<()> {
        self.wait_for(op, req, self.timeout, true)
    }

    /// [`Mpi::wait`] with its own limit, and whether a stop request ends it.
    fn wait_for(
        &self,
        op: &str,
        mut req: ffi::MPI_Request,
        limit: Duration,
        stoppable: bool,
    ) -> Result<()> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(1);
        loop {
            let mut flag = 0;
            // SAFETY: `req` is an active request of this process; the
            // status is ignored.
            let rc = unsafe { ffi::MPI_Test(&mut req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if rc != 0 {
                return Err(peer_error(op, &format!("MPI error {rc}")));
            }
            if flag != 0 {
                return Ok(());
            }
            if let Some(sig) = (self.stop)().filter(|_| stoppable) {
                return Err(Error::Interrupted(sig));
            }
            if start.elapsed() > limit {
                return Err(peer_error(
                    op,
                    &format!("no answer from every rank within {limit:.0?} (--rank-timeout)"),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn all_reduce<T: Copy + Default>(
        &self,
        op: &str,
        buf: &mut [T],
        datatype: ffi::MPI_Datatype,
    ) -> Result<()> {
        let send = buf.to_vec();
        let mut recv = vec![T::default(); buf.len()];
        let mut req = std::mem::MaybeUninit::uninit();
        // SAFETY: both buffers hold `buf.len()` elements of `datatype` and
        // live until the request completes (or are leaked below).
        let rc = unsafe {
            ffi::MPI_Iallreduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                count(buf.len())?,
                datatype,
                ffi::RSMPI_SUM,
                Self::comm(),
                req.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(peer_error(op, &format!("MPI error {rc}")));
        }
        // SAFETY: initialized by MPI_Iallreduce on success.
        match self.wait(op, unsafe { req.assume_init() }) {
            Ok(()) => {
                buf.copy_from_slice(&recv);
                Ok(())
            }
            Err(e) => {
                std::mem::forget(send);
                std::mem::forget(recv);
                Err(e)
            }
        }
    }

    fn broadcast(&self, root: usize, data: &mut Vec<u8>) -> Result<()> {
        let mut req = std::mem::MaybeUninit::uninit();
        // SAFETY: `data` holds `data.len()` bytes, the same count on every
        // rank (sent first), and is leaked if the wait fails.
        let rc = unsafe {
            ffi::MPI_Ibcast(
                data.as_mut_ptr().cast(),
                count(data.len())?,
                ffi::RSMPI_UINT8_T,
                root as i32,
                Self::comm(),
                req.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(peer_error("broadcast", &format!("MPI error {rc}")));
        }
        // SAFETY: initialized by MPI_Ibcast on success.
        self.wait("broadcast", unsafe { req.assume_init() })
            .inspect_err(|_| std::mem::forget(std::mem::take(data)))
    }
}

impl Mpi {
    fn ibarrier(&self, limit: Duration, stoppable: bool) -> Result<()> {
        let mut req = std::mem::MaybeUninit::uninit();
        // SAFETY: a barrier has no buffers.
        let rc = unsafe { ffi::MPI_Ibarrier(Self::comm(), req.as_mut_ptr()) };
        if rc != 0 {
            return Err(peer_error("barrier", &format!("MPI error {rc}")));
        }
        // SAFETY: initialized by MPI_Ibarrier on success.
        self.wait_for("barrier", unsafe { req.assume_init() }, limit, stoppable)
    }
}

fn count(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| {
        Error::Config(format!(
            "a collective of {n} elements: MPI counts stop at {}",
            i32::MAX
        ))
    })
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn describe(&self) -> String {
        format!("MPI ({}), {} ranks", self.library, self.size)
    }
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        // SAFETY: reading an MPI constant.
        let t = unsafe { ffi::RSMPI_FLOAT };
        // Counts above i32::MAX go in pieces.
        for piece in buf.chunks_mut(1 << 30) {
            self.all_reduce("all-reduce", piece, t)?;
        }
        Ok(())
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        // SAFETY: reading an MPI constant.
        let t = unsafe { ffi::RSMPI_DOUBLE };
        for piece in buf.chunks_mut(1 << 30) {
            self.all_reduce("all-reduce", piece, t)?;
        }
        Ok(())
    }
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<()> {
        let mut len = (buf.len() as u64).to_le_bytes().to_vec();
        self.broadcast(root, &mut len)?;
        let n = u64::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
        buf.resize(n, 0);
        self.broadcast(root, buf)
    }
    fn barrier(&self) -> Result<()> {
        self.ibarrier(self.timeout, true)
    }
    fn farewell(&self, limit: Duration) -> Result<()> {
        self.ibarrier(limit, false)
    }
}

/// MPI_Finalize, after a run that every rank completed.
pub fn finish() {
    drop(UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()).take());
}
