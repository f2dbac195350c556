//! The remote engine against a scripted HTTP server on a local socket, for what a real
//! llama-server will not do on demand: never answer (the request's watchdog goes HUNG and saying
//! where, and a stop still returns at once), answer 503 with `Retry-After` (honoured), send a
//! malformed event or close mid-answer (the partial answer kept, marked); and reasoning split off
//! by the server (`reasoning_content` deltas), shown as reasoning.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hipscope::gpu::snapshot::{WatchState, WatchdogSnapshot};
use hipscope::model::protocol::{SamplerConfig, StopReason};
use hipscope::model::remote::client::{Budgets, KeySource, RemoteSpec};
use hipscope::model::remote::connect;
use hipscope::model::session::{Control, Progress};

#[derive(Clone, Copy)]
enum Script {
    Hang,
    Busy,
    Malformed,
    Drop,
    /// Reasoning split off by the server, as llama-server sends it (`reasoning_content`).
    Reasoning,
}

fn chunk(text: &str) -> String {
    format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}},\"finish_reason\":null}}]}}\n\n",
        serde_json::to_string(text).unwrap()
    )
}

fn reasoning_chunk(text: &str) -> String {
    format!(
        "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"reasoning_content\":{}}}}}]}}\n\n",
        serde_json::to_string(text).unwrap()
    )
}

fn serve(script: Script) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let calls = Arc::new(Mutex::new(0u32));
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(c) = conn else { return };
            let calls = calls.clone();
            std::thread::spawn(move || answer(c, script, &calls));
        }
    });
    url
}

fn answer(mut c: TcpStream, script: Script, calls: &Mutex<u32>) {
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut first = String::new();
    r.read_line(&mut first).unwrap();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
    if path == "/v1/models" {
        let b = r#"{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm"}]}"#;
        let _ = write!(
            c,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
            b.len()
        );
        return;
    }
    if path != "/v1/chat/completions" {
        let _ = write!(
            c,
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        return;
    }
    let n = {
        let mut g = calls.lock().unwrap();
        *g += 1;
        *g
    };
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
    match script {
        Script::Hang => {
            // Accepts the request and never answers.
            std::thread::sleep(Duration::from_secs(30));
        }
        Script::Busy if n == 1 => {
            let b = r#"{"error":{"message":"server busy"}}"#;
            let _ = write!(
                c,
                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                b.len()
            );
        }
        Script::Busy => {
            let _ = write!(
                c,
                "{head}{}{}data: [DONE]\n\n",
                chunk("Hello"),
                chunk(" there")
            );
        }
        Script::Malformed => {
            let _ = write!(c, "{head}{}data: {{oops\n\n", chunk("Partial"));
        }
        Script::Reasoning => {
            let _ = write!(
                c,
                "{head}{}{}{}{}data: [DONE]\n\n",
                reasoning_chunk("Greeting;"),
                reasoning_chunk(" reply."),
                chunk("Hello"),
                chunk(" there")
            );
        }
        Script::Drop => {
            let _ = write!(c, "{head}{}{}", chunk("Half an"), chunk(" answer"));
            let _ = c.flush();
            std::thread::sleep(Duration::from_millis(100));
            // Closed without finishing: no finish_reason, no [DONE].
        }
    }
}

fn spec(url: String) -> RemoteSpec {
    RemoteSpec {
        name: "fake".into(),
        url,
        model: None,
        key: KeySource::None,
        insecure: false,
        budgets: Budgets {
            first_token: Duration::from_millis(300),
            between_tokens: Duration::from_millis(300),
            connect: Duration::from_secs(2),
        },
    }
}

type Seen = Arc<Mutex<Vec<WatchdogSnapshot>>>;

fn session(script: Script) -> (hipscope::model::remote::session::RemoteSession, Seen) {
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    let c = connect(
        spec(serve(script)),
        SamplerConfig::default(),
        Box::new(move |w| s2.lock().unwrap().push(w)),
    )
    .expect("connect");
    assert_eq!(c.model.architecture, "vLLM");
    (c.session, seen)
}

#[test]
fn a_server_that_never_answers_is_hung_and_a_stop_still_returns_at_once() {
    let (mut s, seen) = session(Script::Hang);
    let t0 = Instant::now();
    let mut stop_at = None;
    let a = s
        .chat("hello", &mut |p| {
            if let Progress::Waiting = p
                && t0.elapsed() > Duration::from_millis(900)
            {
                stop_at.get_or_insert(Instant::now());
                return Control::Stop;
            }
            Control::Continue
        })
        .unwrap();
    let stopped = stop_at.expect("asked to stop");
    assert!(
        stopped.elapsed() < Duration::from_millis(200),
        "the stop waited on the network"
    );
    assert_eq!(a.reason, StopReason::User);
    let seen = seen.lock().unwrap();
    let hung = seen
        .iter()
        .find(|w| w.state == WatchState::Hung)
        .expect("the watchdog never said HUNG");
    assert!(hung.is_remote());
    assert_eq!(hung.budget, Duration::from_millis(300));
    assert!(
        hung.op
            .as_deref()
            .is_some_and(|o| o.contains("prompt processing")),
        "{:?}",
        hung.op
    );
    assert!(seen.iter().any(|w| w.state == WatchState::Slow));
    // After the request the watchdog is back to OK.
    assert_eq!(seen.last().unwrap().state, WatchState::Ok);
}

#[test]
fn retry_after_is_honoured() {
    let (mut s, _) = session(Script::Busy);
    let t0 = Instant::now();
    let a = s.chat("hello", &mut |_| Control::Continue).unwrap();
    assert_eq!(a.text, "Hello there");
    assert_eq!(a.reason, StopReason::Eog);
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "did not wait for Retry-After"
    );
}

#[test]
fn a_malformed_event_or_a_dropped_stream_keeps_the_partial_answer() {
    let (mut s, _) = session(Script::Malformed);
    let a = s.chat("hello", &mut |_| Control::Continue).unwrap();
    assert_eq!(a.text, "Partial");
    match &a.reason {
        StopReason::Dropped(why) => assert!(why.contains("malformed event"), "{why}"),
        r => panic!("{r:?}"),
    }
    // The exchange is in the history, so that Alt-R asks the same question again.
    assert_eq!(s.turns().len(), 1);
    assert_eq!(s.pop_answer().as_deref(), Some("hello"));

    let (mut s, _) = session(Script::Drop);
    let a = s.chat("hello", &mut |_| Control::Continue).unwrap();
    assert_eq!(a.text, "Half an answer");
    assert!(matches!(a.reason, StopReason::Dropped(_)), "{:?}", a.reason);
}

/// A server that splits the reasoning off (llama-server's `reasoning_content` deltas): the
/// reasoning reaches the chat as reasoning, the answer as the answer.
#[test]
fn reasoning_deltas_are_reasoning() {
    let (mut s, _) = session(Script::Reasoning);
    let mut seen = Vec::new();
    let a = s
        .chat("hello", &mut |p| {
            match p {
                Progress::Reasoning(t) => seen.push(format!("r:{t}")),
                Progress::Text(t) => seen.push(format!("a:{t}")),
                _ => {}
            }
            Control::Continue
        })
        .unwrap();
    assert_eq!(seen, ["r:Greeting;", "r: reply.", "a:Hello", "a: there"]);
    assert_eq!(
        (a.reasoning.as_str(), a.text.as_str()),
        ("Greeting; reply.", "Hello there")
    );
    assert_eq!(a.stats.reasoning_tokens, 2);
    // The history keeps the answer alone.
    assert_eq!(
        s.turns(),
        [("hello".to_string(), "Hello there".to_string())]
    );
}
