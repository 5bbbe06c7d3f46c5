//! Waking the queues of a table in this process when a job is enqueued: a registry of running
//! queues, apart from the inserts as the runner registers in it too.
//!
//! In-process wake-ups find queues by their table's bare name, case folded: `jobs`,
//! `public.jobs` and `"public"."jobs"` wake each other. Two tables of one name in two schemas
//! wake each other too, which costs a claim that finds nothing, never a missed row.

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

/// A running queue's entry in the wake-ups of this process.
struct Entry {
    table: Box<str>,
    group: Option<Box<str>>,
    notify: Weak<Notify>,
}

static QUEUES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Registers a running queue: it is woken for as long as the returned `Notify` lives.
pub(crate) fn wakes(table: &str, group: Option<&str>) -> Arc<Notify> {
    let notify = Arc::new(Notify::new());
    let table = bare(table);
    let mut queues = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
    queues.retain(|entry| entry.notify.strong_count() > 0);
    queues.push(Entry {
        table,
        group: group.map(Into::into),
        notify: Arc::downgrade(&notify),
    });
    notify
}

/// Wakes every queue of `table` serving `group` (every queue of the table when `group` is
/// `None`). A queue that is busy keeps the wake-up for its next wait.
pub(crate) fn wake(table: &str, group: Option<&str>) {
    let table = bare(table);
    let queues = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
    for entry in queues.iter() {
        let same_group = group.is_none() || entry.group.as_deref() == group;
        if *entry.table == *table
            && same_group
            && let Some(notify) = entry.notify.upgrade()
        {
            notify.notify_one();
        }
    }
}

/// The table's name without its schema and quotes, case folded.
fn bare(table: &str) -> Box<str> {
    let name = table.rsplit('.').next().unwrap_or(table);
    name.trim_matches(['"', '`']).to_lowercase().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_reaches_its_table_and_group_only() {
        let mail = wakes("wake_test_jobs", Some("mail"));
        let sms = wakes("wake_test_jobs", Some("sms"));
        wake("wake_test_jobs", Some("mail"));
        tokio::time::timeout(Duration::from_secs(1), mail.notified())
            .await
            .expect("the mail queue is woken");
        let woken = tokio::time::timeout(Duration::from_millis(20), sms.notified()).await;
        assert!(woken.is_err(), "the sms queue is not woken");
        wake("public.\"Wake_test_jobs\"", Some("sms"));
        tokio::time::timeout(Duration::from_secs(1), sms.notified())
            .await
            .expect("another spelling of the table wakes its queue");
    }
}
