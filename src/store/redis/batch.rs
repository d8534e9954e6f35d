//! Many requests' checks in one `gcra.lua` call.
//!
//! A check that finds fewer than [`MAX_IN_FLIGHT`] calls (per connection) in flight to its
//! slot (on one node: to the server) sends its own call at once, from its own future:
//! nothing is delayed when nothing is in flight. The checks that arrive while that many
//! are in flight wait in the slot's queue; when a call ends, the queue (up to the batch
//! bounds: requests and bytes) goes out as one call that decides each request on its own,
//! one after the other, each all or nothing across its limits (see the script). Redis then pays one
//! script invocation, one `TIME` and one `MGET` for the whole batch instead of one each per
//! request; requests of the same plain GCRA limits (a hot key) go as one group, decided in
//! one pass with one `SET` per key (`coalesce.rs`).
//!
//! A batch runs in a task of its own, so a caller that gives up (a timeout, a client gone)
//! never strands the others; a caller that gave up before its batch left is not sent. A
//! failed call fails each request of the batch, and each then follows its own limits'
//! failure policy, as a failed call of its own would. The queue holds at most
//! [`MAX_WAITING`] requests per slot; beyond that a check sends its own call, as without
//! batching.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::coalesce;
use super::keys::Slot;
use super::reply::Failure;
use super::*;

/// Calls to one slot that may be in flight before checks queue (two: while Redis runs one
/// batch, the next is on its way, so Redis never waits for the network). One made larger
/// batches but saved only about 4% of Redis's time per decision, and lost a fifth of the
/// decisions a second at 256 concurrent checks (`redis_bench`, interleaved runs).
pub(super) const MAX_IN_FLIGHT: usize = 2;
/// The most requests one call decides, by default.
pub(super) const DEFAULT_MAX_BATCH: usize = 128;
/// The most bytes of keys and arguments one batched call carries (a request larger than
/// this alone still goes, alone).
pub(super) const MAX_BATCH_BYTES: usize = 64 * 1024;
/// The most checks waiting for one slot; past it a check sends its own call.
pub(super) const MAX_WAITING: usize = 4_096;
/// Calls to one slot in flight at most, per connection, when checks have waited their
/// longest behind slow calls (see [`Request::leave_by`]).
pub(super) const MAX_IN_FLIGHT_LATE: usize = 8 * MAX_IN_FLIGHT;

/// One request's limits in one slot: `group` indexes `parts`.
pub(super) struct Request {
    pub(super) parts: Arc<[Part]>,
    pub(super) group: SmallVec<[usize; 4]>,
}

impl Request {
    /// Roughly what the request adds to a call: its keys and about 24 bytes of
    /// arguments per limit.
    fn bytes(&self) -> usize {
        self.group
            .iter()
            .map(|&i| self.parts[i].redis_key.len() + 24)
            .sum()
    }

    /// How long this request may wait in a slot's queue: half the time the quickest of
    /// its buckets takes to fill (burst × emission interval; a window: its length). A
    /// check held longer behind slow calls (late replies) reaches Redis after tokens it
    /// could have had were lost to a full bucket, and the checks held with it arrive
    /// together, as a burst: it goes in a call of its own turn instead.
    fn patience_ns(&self) -> u64 {
        self.group
            .iter()
            .map(|&i| {
                let q = &self.parts[i].quota;
                q.burst_size().saturating_mul(q.t_ns()) / 2
            })
            .min()
            .unwrap_or(0)
    }

    /// The integers this request's part of the reply holds.
    fn width(&self) -> usize {
        self.group.iter().map(|&i| self.parts[i].width()).sum()
    }
}

type Reply = Result<Vec<i64>, Failure>;

struct Waiting {
    request: Request,
    tx: oneshot::Sender<Reply>,
    /// When it has waited as long as it may (see [`Request::patience_ns`]).
    leave_by: tokio::time::Instant,
}

#[derive(Default)]
struct Queue {
    in_flight: usize,
    waiting: VecDeque<Waiting>,
}

/// What a check arriving at a slot's queue does.
#[derive(Debug, PartialEq, Eq)]
enum Admit {
    /// Sends its own call, on a turn of its own.
    Own,
    /// Waits for the next batch.
    Wait,
    /// Waits, and the queue goes now on a turn of its own: its oldest check waited as long
    /// as it may while the calls in flight were slow.
    Flush,
}

impl Queue {
    /// What a check arriving at `now` does, with `max_in_flight` turns.
    fn admit(&self, now: tokio::time::Instant, max_in_flight: usize) -> Admit {
        if self.in_flight < max_in_flight || self.waiting.len() >= MAX_WAITING {
            return Admit::Own;
        }
        let overdue = self.waiting.front().is_some_and(|w| w.leave_by <= now);
        let late_turns = max_in_flight / MAX_IN_FLIGHT * MAX_IN_FLIGHT_LATE;
        if overdue && self.in_flight < late_turns {
            Admit::Flush
        } else {
            Admit::Wait
        }
    }
}

/// The queues of one store's backend, by slot (one on a single node); a slot's queue is
/// dropped when it has nothing in flight and nothing waiting.
pub(super) struct Batcher {
    queues: Mutex<HashMap<Slot, Queue>>,
    max_requests: usize,
    /// Calls in flight to a slot before checks queue: [`MAX_IN_FLIGHT`] per connection.
    max_in_flight: usize,
}

impl fmt::Debug for Batcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("max_requests", &self.max_requests)
            .finish_non_exhaustive()
    }
}

/// What a check does: send its own call (holding one of the slot's in-flight turns, given
/// back or passed on to the waiting batch when the guard drops), or wait for a batch.
pub(super) enum Turn {
    Own(Request, Option<InFlight>),
    Queued(oneshot::Receiver<Reply>),
}

/// One in-flight turn of a slot: on drop, the checks that queued meanwhile go out.
pub(super) struct InFlight {
    backend: RedisBackend,
    slot: Slot,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.backend.batcher.hand_over(&self.backend, self.slot);
    }
}

impl Batcher {
    /// `max_requests` per call; 1 sends every check on its own call. `connections`: how
    /// many connections the calls are spread over.
    pub(super) fn new(max_requests: usize, connections: usize) -> Self {
        Self {
            queues: Mutex::default(),
            max_requests: max_requests.max(1),
            max_in_flight: MAX_IN_FLIGHT * connections.max(1),
        }
    }

    pub(super) fn max_requests(&self) -> usize {
        self.max_requests
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Slot, Queue>> {
        // The lock guards plain bookkeeping that no panic leaves half done.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `request` for `slot` goes now or waits for a batch.
    pub(super) fn enter(&self, backend: &RedisBackend, slot: Slot, request: Request) -> Turn {
        if self.max_requests == 1 {
            return Turn::Own(request, None);
        }
        let now = tokio::time::Instant::now();
        let mut queues = self.lock();
        let queue = queues.entry(slot).or_default();
        let admit = queue.admit(now, self.max_in_flight);
        if admit == Admit::Own {
            queue.in_flight += 1;
            drop(queues);
            let turn = InFlight {
                backend: backend.clone(),
                slot,
            };
            return Turn::Own(request, Some(turn));
        }
        let (tx, rx) = oneshot::channel();
        let leave_by = now + std::time::Duration::from_nanos(request.patience_ns());
        queue.waiting.push_back(Waiting {
            request,
            tx,
            leave_by,
        });
        if admit == Admit::Flush {
            let batch = self.take(queue);
            queue.in_flight += 1;
            drop(queues);
            self.send_on_new_turn(backend, slot, batch);
        }
        Turn::Queued(rx)
    }

    /// Sends `batch` on a turn just counted for `slot`, in a task of its own.
    fn send_on_new_turn(&self, backend: &RedisBackend, slot: Slot, batch: Vec<Waiting>) {
        let turn = InFlight {
            backend: backend.clone(),
            slot,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(run(turn, batch));
            }
            // No runtime: the checks fail (their senders dropped), the turn goes back.
            Err(_) => drop((batch, turn)),
        }
    }

    /// A call to `slot` ended: the next batch goes out in a task of its own (keeping the
    /// turn), or the turn is given back.
    fn hand_over(&self, backend: &RedisBackend, slot: Slot) {
        let batch = {
            let mut queues = self.lock();
            let Some(queue) = queues.get_mut(&slot) else {
                return;
            };
            let batch = self.take(queue);
            if batch.is_empty() {
                queue.in_flight -= 1;
                if queue.in_flight == 0 && queue.waiting.is_empty() {
                    queues.remove(&slot);
                }
                return;
            }
            batch
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // The task holds the turn: ended or cancelled (its runtime shutting down),
                // it hands it over in turn.
                let turn = InFlight {
                    backend: backend.clone(),
                    slot,
                };
                runtime.spawn(run(turn, batch));
            }
            // No runtime (it is shutting down): the waiting checks fail (their receivers
            // see the senders dropped) and the turn is given back.
            Err(_) => {
                drop(batch);
                self.hand_over(backend, slot);
            }
        }
    }

    /// The next batch from `queue`: its oldest live checks, within the bounds.
    fn take(&self, queue: &mut Queue) -> Vec<Waiting> {
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(next) = queue.waiting.front() {
            if next.tx.is_closed() {
                // Its caller gave up: not sent.
                queue.waiting.pop_front();
                continue;
            }
            let size = next.request.bytes();
            if !batch.is_empty()
                && (batch.len() == self.max_requests || bytes + size > MAX_BATCH_BYTES)
            {
                break;
            }
            bytes += size;
            batch.extend(queue.waiting.pop_front());
        }
        batch
    }
}

/// Sends batches to the turn's slot while its queue has checks; the turn is handed over
/// when the task ends, however it ends.
async fn run(turn: InFlight, mut batch: Vec<Waiting>) {
    let backend = &turn.backend;
    loop {
        let reply = {
            let requests: Vec<&Request> = batch.iter().map(|w| &w.request).collect();
            backend.send(&requests).await
        };
        match reply {
            Ok(replies) => {
                for (w, r) in batch.into_iter().zip(replies) {
                    let _ = w.tx.send(Ok(r));
                }
            }
            Err(e) => {
                for w in batch {
                    let _ = w.tx.send(Err(e.clone()));
                }
            }
        }
        batch = {
            let mut queues = backend.batcher.lock();
            match queues.get_mut(&turn.slot) {
                Some(queue) => backend.batcher.take(queue),
                None => Vec::new(),
            }
        };
        if batch.is_empty() {
            return;
        }
    }
}

impl RedisBackend {
    /// One `gcra.lua` call deciding `requests` (keys in one slot) one after the other,
    /// those of the same plain GCRA limits coalesced into groups (`coalesce.rs`); answers
    /// each request's reply as if it had been alone: `now`, then its limits'.
    pub(super) async fn send(&self, requests: &[&Request]) -> Result<Vec<Vec<i64>>, Failure> {
        let view = |r: usize| (&requests[r].parts[..], &requests[r].group[..]);
        let entries = coalesce::entries(requests.iter().map(|r| (&r.parts[..], &r.group[..])));
        let keys = entries.iter().map(|e| requests[e[0]].group.len()).sum();
        let mut cmd = evalsha(&GCRA, keys);
        for e in &entries {
            let r = requests[e[0]];
            for &i in &r.group {
                cmd.arg(r.parts[i].redis_key.as_slice());
            }
        }
        cmd.arg(self.now_arg());
        for e in &entries {
            if let [one] = e[..] {
                let r = requests[one];
                cmd.arg(r.group.len());
                for &i in &r.group {
                    r.parts[i].push_args(&mut cmd);
                }
            } else {
                coalesce::push_group(&mut cmd, e.iter().map(|&r| view(r)));
            }
        }
        let width = |e: &coalesce::Entry| match e[..] {
            [one] => requests[one].width(),
            _ => coalesce::width(requests[e[0]].group.len()),
        };
        let reply: Vec<i64> = self.conn.eval(&cmd, &GCRA).await.map_err(Failure::Redis)?;
        let expected = 1 + entries.iter().map(width).sum::<usize>();
        if reply.len() != expected {
            return Err(Failure::Reply(reply.len()));
        }
        if requests.len() == 1 {
            // A request alone (the usual call when nothing else is in flight): its reply
            // as it came.
            return Ok(vec![reply]);
        }
        let now = reply[0];
        let mut rest = &reply[1..];
        let mut out = vec![Vec::new(); requests.len()];
        for e in &entries {
            let (mine, tail) = rest.split_at(width(e));
            rest = tail;
            if let [one] = e[..] {
                let mut r = Vec::with_capacity(1 + mine.len());
                r.push(now);
                r.extend_from_slice(mine);
                out[one] = r;
            } else {
                let replies = coalesce::expand(now, mine, e.iter().map(|&r| view(r)))
                    .ok_or(Failure::Reply(reply.len()))?;
                for (&r, reply) in e.iter().zip(replies) {
                    out[r] = reply;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(key_len: usize) -> Request {
        let part = Part {
            redis_key: vec![b'k'; key_len],
            quota: Quota::per_second(10),
            cost: 1,
            mode: Mode::Enforce,
            algorithm: Algorithm::Gcra,
            phase_us: 0,
            max_wait_us: 0,
            span: None,
            held: None,
            settle: None,
            ban: None,
        };
        Request {
            parts: Arc::from(vec![part]),
            group: smallvec::smallvec![0],
        }
    }

    fn queue(sizes: &[usize]) -> (Queue, Vec<oneshot::Receiver<Reply>>) {
        let mut queue = Queue::default();
        let mut receivers = Vec::new();
        for &size in sizes {
            let (tx, rx) = oneshot::channel();
            queue.waiting.push_back(Waiting {
                request: request(size),
                tx,
                leave_by: tokio::time::Instant::now(),
            });
            receivers.push(rx);
        }
        (queue, receivers)
    }

    #[test]
    fn a_batch_stops_at_its_request_bound() {
        let batcher = Batcher::new(3, 1);
        let (mut queue, _rx) = queue(&[10; 7]);
        assert_eq!(batcher.take(&mut queue).len(), 3);
        assert_eq!(batcher.take(&mut queue).len(), 3);
        assert_eq!(batcher.take(&mut queue).len(), 1);
        assert!(batcher.take(&mut queue).is_empty());
    }

    #[test]
    fn a_batch_stops_at_its_byte_bound_but_a_large_request_still_goes() {
        let batcher = Batcher::new(1_000, 1);
        let big = MAX_BATCH_BYTES; // over the bound with its arguments
        let (mut queue, _rx) = queue(&[big, 100, big / 2, big / 2]);
        assert_eq!(batcher.take(&mut queue).len(), 1, "alone, yet sent");
        assert_eq!(
            batcher.take(&mut queue).len(),
            2,
            "100 + half fits, not the other half"
        );
        assert_eq!(batcher.take(&mut queue).len(), 1);
    }

    #[test]
    fn checks_whose_caller_gave_up_are_not_sent() {
        let batcher = Batcher::new(10, 1);
        let (mut queue, mut rx) = queue(&[10; 4]);
        rx.remove(2);
        rx.remove(0);
        let batch = batcher.take(&mut queue);
        assert_eq!(batch.len(), 2);
        assert!(batch.iter().all(|w| !w.tx.is_closed()));
        assert!(queue.waiting.is_empty());
    }

    /// Checks against a port nothing listens on (each call fails at once), a third of
    /// them cancelled while they wait: when all have ended, every slot's turns are back
    /// and its queue is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_turn_comes_back_whether_checks_end_fail_or_are_cancelled() {
        use crate::model::key::Key;
        let store = RedisStore::open("redis://127.0.0.1:1/").unwrap();
        let backend = store.0.backend().clone();
        let table = backend.table("t");
        let q = Quota::per_second(10);
        let tasks: Vec<_> = (0..96u32)
            .map(|n| {
                let item = Item::new(&table, Key::from_part(n), q, 1);
                tokio::spawn(backend.apply(Op::Check, &[item]))
            })
            .collect();
        for (n, task) in tasks.into_iter().enumerate() {
            if n % 3 == 0 {
                task.abort();
            }
            let _ = task.await;
        }
        // The batch tasks end after the checks they answer: wait for them, however long a
        // loaded machine takes.
        for _ in 0..1_000 {
            if backend.batcher.lock().is_empty() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("turns not handed back: {:?}", backend.batcher.lock().len());
    }

    /// Behind slow calls (late replies), checks wait at most half the time their bucket
    /// takes to fill: the next check after that sends the queue on a turn of its own,
    /// up to `MAX_IN_FLIGHT_LATE` turns per connection.
    #[test]
    fn checks_held_behind_slow_calls_leave_by_their_bound() {
        // 10/s with a burst of 10: full in 1 s, so a check waits at most 500 ms.
        assert_eq!(request(4).patience_ns(), 500_000_000);
        let now = tokio::time::Instant::now();
        let ms = std::time::Duration::from_millis;
        let (mut queue, _rx) = queue(&[]);
        let max = MAX_IN_FLIGHT * 2; // two connections
        for in_flight in 0..max {
            queue.in_flight = in_flight;
            assert_eq!(queue.admit(now, max), Admit::Own, "a turn is free");
        }
        queue.in_flight = max;
        assert_eq!(queue.admit(now, max), Admit::Wait, "nothing waiting yet");
        let (tx, _rx1) = oneshot::channel();
        queue.waiting.push_back(Waiting {
            request: request(4),
            tx,
            leave_by: now + ms(500),
        });
        assert_eq!(queue.admit(now + ms(499), max), Admit::Wait);
        assert_eq!(queue.admit(now + ms(500), max), Admit::Flush);
        queue.in_flight = MAX_IN_FLIGHT_LATE * 2 - 1;
        assert_eq!(queue.admit(now + ms(500), max), Admit::Flush);
        queue.in_flight = MAX_IN_FLIGHT_LATE * 2;
        assert_eq!(
            queue.admit(now + ms(900), max),
            Admit::Wait,
            "at most MAX_IN_FLIGHT_LATE turns per connection"
        );
        // A full queue: a check sends its own call, as before.
        queue.in_flight = max;
        while queue.waiting.len() < MAX_WAITING {
            let (tx, _) = oneshot::channel();
            queue.waiting.push_back(Waiting {
                request: request(4),
                tx,
                leave_by: now + ms(500),
            });
        }
        assert_eq!(queue.admit(now, max), Admit::Own);
    }

    #[test]
    fn one_per_call_never_queues() {
        let batcher = Batcher::new(0, 1);
        assert_eq!(batcher.max_requests(), 1);
    }
}
