//! Work handed to idle threads only.
//!
//! Some reads may wait as long as the kernel likes: `/proc/PID/maps` of a
//! task stuck in an OOM it set off waits for that task's memory map lock.
//! Such a read must never run on the thread that commits kills, and a job
//! must never queue behind one that is stuck. A [`Handoff`] gives a job to
//! one of its threads only if that thread is waiting for work at that
//! moment (a rendezvous channel); otherwise the job is handed back at once
//! and the caller does without.

use std::{
    io,
    sync::{
        Arc, Mutex,
        mpsc::{Receiver, SyncSender, TrySendError, sync_channel},
    },
};

/// A few threads that take jobs only when idle.
pub struct Handoff<J> {
    tx: Option<SyncSender<J>>,
}

impl<J: Send + 'static> Handoff<J> {
    /// Starts `threads` threads called `name` that each run `work` on the
    /// jobs they take. They end when the handoff is dropped (a thread stuck
    /// in a job ends with the process).
    pub fn spawn(
        name: &str,
        threads: usize,
        work: impl Fn(J) + Send + Sync + 'static,
    ) -> io::Result<Self> {
        let (tx, rx) = sync_channel::<J>(0);
        let rx: Arc<Mutex<Receiver<J>>> = Arc::new(Mutex::new(rx));
        let work = Arc::new(work);
        for _ in 0..threads {
            let (rx, work) = (rx.clone(), work.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    loop {
                        // One thread waits in recv (the rendezvous), the
                        // others for the lock; a job taken frees the lock.
                        let job = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(j) => work(j),
                            Err(_) => return,
                        }
                    }
                })?;
        }
        Ok(Self { tx: Some(tx) })
    }

    /// Gives `job` to a thread waiting for work now, or hands it back.
    pub fn offer(&self, job: J) -> Result<(), J> {
        match &self.tx {
            Some(tx) => tx.try_send(job).map_err(|e| match e {
                TrySendError::Full(j) | TrySendError::Disconnected(j) => j,
            }),
            None => Err(job),
        }
    }

    /// Stops taking jobs; idle threads end.
    pub fn close(&mut self) {
        self.tx = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        sync::mpsc::channel,
        time::{Duration, Instant},
    };

    /// Two threads stuck in their jobs: a third job is handed back at
    /// once, not queued behind them; freed, they take jobs again.
    #[test]
    fn a_job_never_waits_behind_stuck_ones() {
        let (release_tx, release_rx) = channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let (done_tx, done_rx) = channel::<u32>();
        let done_tx = Mutex::new(done_tx);
        let h = Handoff::spawn("test-handoff", 2, move |j: u32| {
            if j < 2 {
                // Stuck until released.
                let _ = release_rx.lock().unwrap().recv();
            }
            let _ = done_tx.lock().unwrap().send(j);
        })
        .unwrap();
        // Each of the first two is taken once a thread waits for it.
        for j in 0..2 {
            let t0 = Instant::now();
            let mut job = j;
            while let Err(back) = h.offer(job) {
                job = back;
                assert!(t0.elapsed() < Duration::from_secs(5), "no idle thread");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        let t0 = Instant::now();
        assert_eq!(h.offer(7), Err(7), "both threads are stuck");
        assert!(
            t0.elapsed() < Duration::from_millis(20),
            "{:?}",
            t0.elapsed()
        );
        release_tx.send(()).unwrap();
        release_tx.send(()).unwrap();
        let mut job = 9;
        let t0 = Instant::now();
        while let Err(back) = h.offer(job) {
            job = back;
            assert!(t0.elapsed() < Duration::from_secs(5), "never free again");
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut done: Vec<u32> = (0..3)
            .map(|_| done_rx.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        done.sort_unstable();
        assert_eq!(done, [0, 1, 9]);
    }
}
