//! Unique jobs: one unfinished job per key, kept by the table's unique index, and what an enqueue
//! of a key already taken does — skip, replace or debounce.
//!
//! One enqueue, top to bottom: the insert of every job whose key is free (a taken key inserts
//! nothing: `ON CONFLICT DO NOTHING`, or MySQL/MariaDB's duplicate-key error, after which the
//! keys are read and only the free ones inserted); then the rows that hold the other keys are
//! read, and each job's policy is applied to its key's row — an update that changes nothing of a
//! job in work. A key freed meanwhile (its row finished between the insert and the read) goes
//! round again. The index decides every race; no statement is a check that an insert trusts.
//!
//! The rounds are here; the statements each round runs, with their error paths, are apart
//! (`statements`).

mod locks;
mod statements;

use super::transaction::Runs;
use super::unique_job::{Enqueued, OnDuplicate, UniqueJob};
use super::wake;
use crate::backend::{Backend, Clock};
use crate::dialect::Names;
use crate::error::{Error, Result};
use crate::table::Table;
use locks::KeyLocks;
pub(super) use statements::no_unique_index;

/// How often a key is looked for again when it was freed between the insert and the read.
const ROUNDS: usize = 8;

impl Table {
    /// Enqueues unique jobs on `conn`, each by its own policy, in order
    /// ([`Queue::enqueue_many_unique`](crate::Queue::enqueue_many_unique); a periodic job's tick,
    /// in a transaction of the crate's own), waking the queues of the groups it changed.
    pub(crate) async fn many_unique_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        jobs: &[UniqueJob<'_>],
    ) -> Result<Vec<Enqueued>> {
        let (names, key_column) = self.unique_names::<DB>(jobs)?;
        let done = self.locked::<DB>(conn, &names, &key_column, jobs).await?;
        self.wake_for(jobs, &done);
        Ok(done)
    }

    /// The rounds of one enqueue in their transaction (the caller's; on a pool the crate's own,
    /// run again after a deadlock), its keys' named locks held around it on MySQL/MariaDB.
    async fn locked<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        key_column: &str,
        jobs: &[UniqueJob<'_>],
    ) -> Result<Vec<Enqueued>> {
        let locks = KeyLocks::of::<DB>(self, jobs);
        locks.take::<DB>(conn).await?;
        // Inside the caller's transaction, in it (a deadlock ends it on MySQL/MariaDB).
        let mut runs = Runs::on::<DB>(conn, false);
        let done = loop {
            let mut run = match runs.begin::<DB>(conn).await {
                Ok(run) => run,
                Err(error) => break Err(error),
            };
            let done = self.rounds::<DB>(&mut run, names, key_column, jobs).await;
            if let Some(done) = runs.end(run, done).await {
                break done;
            }
        };
        let released = locks.release::<DB>(conn).await;
        let done = done?;
        released?;
        Ok(done)
    }

    /// The table's names and its quoted unique key column, once `jobs` are found fit for it.
    fn unique_names<DB: Backend>(&self, jobs: &[UniqueJob<'_>]) -> Result<(Names, String)> {
        let names = Names::of_table(DB::DIALECT, self)?;
        let Some(key_column) = names.unique_key.clone() else {
            return Err(Error::invalid_job(
                &self.name,
                format!(
                    "a unique job needs a unique key column: declare it with \
                     `Table::unique_key(..)` on table `{}`",
                    self.name
                ),
            ));
        };
        for job in jobs {
            self.check_unique(job)?;
        }
        if jobs.len() > self.max_batch() {
            return Err(Error::invalid_job(
                &self.name,
                format!(
                    "{} jobs do not fit one statement: enqueue_many_unique takes at most {}",
                    jobs.len(),
                    self.max_batch()
                ),
            ));
        }
        Ok((names, key_column))
    }

    /// The rounds of one enqueue: insert the free keys, meet the holders of the others, and go
    /// round again for a key freed meanwhile.
    async fn rounds<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        key_column: &str,
        jobs: &[UniqueJob<'_>],
    ) -> Result<Vec<Enqueued>> {
        let clock = Clock::default();
        let mut done: Vec<Option<Enqueued>> = vec![None; jobs.len()];
        for _ in 0..ROUNDS {
            // The first job of each key still open goes in; a key given again waits its turn.
            let mut seen = Vec::new();
            let open: Vec<usize> = (0..jobs.len())
                .filter(|&i| done[i].is_none())
                .filter(|&i| {
                    let fresh = !seen.contains(&jobs[i].key());
                    seen.push(jobs[i].key());
                    fresh
                })
                .collect();
            if open.is_empty() {
                break;
            }
            let inserted = self
                .insert_free::<DB>(conn, names, key_column, jobs, &open, &clock)
                .await?;
            for &i in &open {
                if let Some(id) = inserted.get(jobs[i].key()) {
                    done[i] = Some(Enqueued::New(*id));
                }
            }
            // Met in the order of their keys, as every enqueue meets them: two enqueues of the
            // same keys never wait for each other's row locks in turn.
            let mut taken: Vec<usize> = open.into_iter().filter(|&i| done[i].is_none()).collect();
            taken.sort_by(|&a, &b| jobs[a].key().cmp(jobs[b].key()));
            if taken.is_empty() {
                continue;
            }
            let keys: Vec<&str> = taken.iter().map(|&i| jobs[i].key()).collect();
            let holders = self.holders::<DB>(conn, names, key_column, &keys).await?;
            for i in taken {
                // A key freed since the insert goes round again.
                if let Some(holder) = holders.get(jobs[i].key()) {
                    done[i] = Some(
                        self.meet::<DB>(conn, names, &jobs[i], holder, &clock)
                            .await?,
                    );
                }
            }
        }
        jobs.iter()
            .zip(done)
            .map(|(job, done)| {
                done.ok_or_else(|| Error::UniqueKeyHidden {
                    table: self.name.clone(),
                    key: job.key().to_owned(),
                })
            })
            .collect()
    }

    /// Wakes the queues in this process of the groups whose jobs `done` inserted or changed.
    fn wake_for(&self, jobs: &[UniqueJob<'_>], done: &[Enqueued]) {
        let mut woken: Vec<Option<&str>> = Vec::new();
        for (job, done) in jobs.iter().zip(done) {
            let group = job.job.group.as_deref();
            if matches!(
                done,
                Enqueued::New(_) | Enqueued::Replaced(_) | Enqueued::Debounced(_)
            ) && !woken.contains(&group)
            {
                wake(&self.name, group);
                woken.push(group);
            }
        }
    }

    /// Refuses a unique job this table cannot hold.
    fn check_unique(&self, job: &UniqueJob<'_>) -> Result<()> {
        self.check(&job.job)?;
        let refuse = |reason: String| Err(Error::invalid_job(&self.name, reason));
        if job.key.contains('\0') {
            return refuse(format!(
                "the unique key {:?} holds a NUL character",
                job.key
            ));
        }
        if matches!(job.on_duplicate, OnDuplicate::Debounce { .. })
            && (self.retry_after.is_none() || self.created_at.is_none())
        {
            return refuse(format!(
                "a debounced job needs a retry_after and a created_at column: declare them \
                 with `Table::retry_after(..)` and `Table::created_at(..)` on table `{}`",
                self.name
            ));
        }
        Ok(())
    }
}
