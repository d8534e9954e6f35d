//! The replay: the rules' layer over a memory store on a fake clock, each logged request
//! sent through its service at the logged time, answered by an inner service with the
//! logged status; refusals and their keys told by the layer's hooks.

use std::future::Future;
use std::io::BufRead;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{HeaderValue, Method, Request};
use tower_layer::Layer;
use tower_service::Service;

use super::answer::{self, Answer, Places, Silent, Usage};
use super::held::Held;
use super::lines::{Line, Lines};
use super::parse::{self, Entry, LogFormat};
use super::report::{BadLine, Report, Tally};
use super::timeline::Timeline;
use super::uris::Uris;
use super::{SimulateError, Simulation};
use crate::base::clock::FakeClock;
use crate::middleware::layer::RateLimitLayer;
use crate::model::key::Key;
use crate::rules::compile;
use crate::rules::document::Document;
use crate::store::MemoryStore;
use crate::web::headers::HeaderStyle;
use crate::web::hooks::{Refusal, RefusalLog};
use crate::web::key::Replaying;

/// Where the replay's clock starts: the first request's time is this far from the fake
/// clock's origin.
const ORIGIN: Duration = Duration::from_secs(86_400);

/// What the hooks saw during one request.
#[derive(Default)]
struct Seen {
    /// The limits checked.
    checked: Vec<&'static str>,
    /// The refusals: limit, key, how (enforced, shadow, by a ban).
    refused: Vec<(&'static str, Option<Key>, Refusal)>,
    /// The bans that began: limit, repeat level.
    began: Vec<(&'static str, u32)>,
}

pub(super) fn run(
    sim: &Simulation,
    doc: &Document,
    input: impl BufRead,
) -> Result<Report, SimulateError> {
    let clock = FakeClock::new();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let compiled = compile::compile_maybe_empty(doc, &compile::CustomKeys::new(), false)?;
    let (on_decision, on_refusal) = (seen.clone(), seen.clone());
    let layer: RateLimitLayer<MemoryStore<FakeClock>, Silent> = compiled
        .apply(RateLimitLayer::builder(MemoryStore::with_clock(
            clock.clone(),
        )))
        .refusal_log(RefusalLog::off())
        // Nobody reads the answers' headers or a refusal's body: they decide nothing.
        .headers(HeaderStyle::None)
        .on_rejection(answer::silent as Silent)
        .decision_extension(false)
        .bare_refusals()
        .on_decision(move |decision, _| {
            let mut seen = on_decision.lock().unwrap_or_else(PoisonError::into_inner);
            seen.checked.extend(decision.limits().map(|l| l.name));
        })
        .tap(Arc::new(move |limit, key, how| {
            let mut seen = on_refusal.lock().unwrap_or_else(PoisonError::into_inner);
            match how {
                Refusal::BanBegan(level) => seen.began.push((limit, level)),
                Refusal::Banned => {
                    // A banned request is refused before its limits are checked.
                    seen.checked.push(limit);
                    seen.refused.push((limit, key.cloned(), how));
                }
                Refusal::Enforced | Refusal::Shadow => {
                    seen.refused.push((limit, key.cloned(), how));
                }
            }
        }))
        .build()
        .map_err(|e| compile::rebase(doc, e))?;
    let status = Arc::new(AtomicU16::new(200));
    let places = Arc::new(Places::of(doc));
    // A line's usage is carried only where a limit reads it.
    let settles = places.any();
    let mut service = layer.layer(Answer {
        status: status.clone(),
        places,
    });
    // The responses held for their logged duration, by end (ns since the origin).
    let mut held = Held::new(sim.max_held);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(SimulateError::Io)?;
    let _entered = runtime.enter();

    let mut tallies: Vec<Tally> = doc.limits.iter().map(|l| Tally::new(&l.name)).collect();
    let mut names = Names::default();
    let mut report = Report {
        lines: 0,
        bad_lines: 0,
        bad: Vec::new(),
        late_lines: 0,
        requests: 0,
        refused: 0,
        with_usage: 0,
        held: 0,
        most_held: 0,
        released_early: 0,
        span: None,
        limits: Vec::new(),
        timeline: Timeline::new(tallies.len()),
        keys: Default::default(),
    };
    let mut lines = Lines::new(input, sim.max_line);
    let mut uris = Uris::default();
    let mut parser = parse::Parser::new(&sim.format);
    // Each request's client, as its peer address (`peer_ip`, `client_ip`).
    let peer = Replaying::start();
    let mut start: Option<i64> = None;
    let mut latest = i64::MIN;
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    let bad = |report: &mut Report, line: u64, reason: &'static str| {
        report.bad_lines += 1;
        if report.bad.len() < sim.max_bad {
            report.bad.push(BadLine { line, reason });
        }
    };
    while let Some((number, line)) = lines.next_line().map_err(SimulateError::Io)? {
        report.lines += 1;
        let text = match line {
            Line::Text(text) => text,
            Line::TooLong => {
                bad(&mut report, number, "line too long");
                continue;
            }
        };
        if text.iter().all(u8::is_ascii_whitespace) {
            bad(&mut report, number, "empty line");
            continue;
        }
        let entry = match parser.parse(text) {
            Ok(entry) => entry,
            Err(reason) => {
                bad(&mut report, number, reason);
                continue;
            }
        };
        let mut request = match request(&sim.format, &entry, &mut uris) {
            Ok(request) => request,
            Err(reason) => {
                bad(&mut report, number, reason);
                continue;
            }
        };
        if let Some(usage) = &entry.usage {
            report.with_usage += 1;
            if settles && let Ok(value) = HeaderValue::from_bytes(usage) {
                request.extensions_mut().insert(Usage(value));
            }
        }
        let mut at = entry.time_ns;
        if at < latest {
            report.late_lines += 1;
            at = latest;
        }
        latest = at;
        let first = *start.get_or_insert(at);
        let since = u64::try_from(at - first).unwrap_or(0);
        // The responses that ended by now end first, each at its own time.
        while let Some((end, body)) = held.due(since) {
            clock.set(ORIGIN + Duration::from_nanos(end));
            answer::end(body, &mut cx);
        }
        clock.set(ORIGIN + Duration::from_nanos(since));
        status.store(entry.status, Ordering::Relaxed);
        peer.set(SocketAddr::new(entry.client, 0));

        let response = {
            let mut future = pin!(service.call(request));
            match future.as_mut().poll(&mut cx) {
                Poll::Ready(r) => r,
                // A store or a delay that waits: the runtime drives it.
                Poll::Pending => runtime.block_on(future),
            }
        };
        let Ok(response) = response;
        report.requests += 1;
        let secs = at.div_euclid(1_000_000_000);
        let bucket = report.timeline.request(secs);
        report.span = Some(match report.span {
            None => (secs, secs),
            Some((s, _)) => (s, secs),
        });
        let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        // A shadow limit's refusal is no refusal.
        if seen.refused.iter().any(|r| r.2 != Refusal::Shadow) {
            report.refused += 1;
        }
        let body = response.into_body();
        // A body whose end gives nothing back (no in-flight unit, no settle) is dropped
        // as it is; the others are held for their duration, or ended now.
        if body.follows() {
            match entry.duration_ns {
                Some(duration) => {
                    report.held += 1;
                    if let Some(early) = held.hold(since.saturating_add(duration), body) {
                        answer::end(early, &mut cx);
                    }
                }
                None => answer::end(body, &mut cx),
            }
        }
        for name in seen.checked.drain(..) {
            if let Some(i) = names.tally(&tallies, name) {
                tallies[i].requests += 1;
            }
        }
        for (name, key, how) in seen.refused.drain(..) {
            if let Some(i) = names.tally(&tallies, name) {
                tallies[i].refusal(key.as_ref(), secs, how, sim.max_keys);
                report.timeline.refusal(i, bucket);
            }
        }
        if !seen.began.is_empty() {
            for (name, level) in seen.began.drain(..) {
                if let Some(i) = names.tally(&tallies, name) {
                    tallies[i].ban_began(level);
                }
            }
        }
    }
    // What is still held ends in order, after the last line.
    while let Some((end, body)) = held.due(u64::MAX) {
        clock.set(ORIGIN + Duration::from_nanos(end));
        answer::end(body, &mut cx);
    }
    report.most_held = held.most as u64;
    report.released_early = held.released_early;
    let keys = &mut report.keys;
    report.limits = tallies
        .into_iter()
        .map(|t| t.finish(sim.top, keys))
        .collect();
    Ok(report)
}

/// Which tally is a limit's: the layer's names are static, so each is found by its text
/// once and by its address after that. Bounded by the limits.
#[derive(Default)]
struct Names {
    /// (address, length) of a name, and its tally.
    known: Vec<((usize, usize), Option<usize>)>,
}

impl Names {
    #[inline]
    fn tally(&mut self, tallies: &[Tally], name: &'static str) -> Option<usize> {
        let at = (name.as_ptr() as usize, name.len());
        if let Some(&(_, i)) = self.known.iter().find(|(a, _)| *a == at) {
            return i;
        }
        let i = tallies.iter().position(|t| t.name == name);
        self.known.push((at, i));
        i
    }
}

/// The request of a log entry: method, path, headers. Its client is not in it: the replay
/// gives it as the peer address of the requests it sends (`Replaying`).
pub(super) fn request(
    format: &LogFormat,
    e: &Entry<'_>,
    uris: &mut Uris,
) -> Result<Request<axum_core::body::Body>, &'static str> {
    // axum's body, as live: a limit of bytes received on its route wraps it (it has no
    // bytes to pace, so it refuses no request).
    let mut request = Request::new(axum_core::body::Body::empty());
    *request.method_mut() = Method::from_bytes(e.method.as_bytes()).map_err(|_| "bad method")?;
    *request.uri_mut() = uris.get(&e.path).ok_or("bad path")?;
    if let LogFormat::Json(fields) = format {
        for (i, value) in &e.headers {
            let value = HeaderValue::from_str(value).map_err(|_| "bad header value")?;
            request
                .headers_mut()
                .append(fields.headers[*i].0.clone(), value);
        }
    }
    Ok(request)
}
