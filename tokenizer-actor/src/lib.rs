//! The tokenizer actor: dpserve's HTTP front end. It tokenizes requests, sends them to the
//! controller over ZeroMQ, and turns the workers' token outputs back into text (JSON or SSE).
//! It holds no routing or model logic; see docs/ARCHITECTURE.md, "Processes and sockets".

mod args;
mod bridge;
pub mod chat_template;
mod cluster_view;
pub mod detokenize;
mod error;
pub mod http;
pub mod metrics;
mod registry;
mod state;
pub mod stop;
pub mod tls;
pub mod tokenizer;

use std::net::TcpListener;
use std::sync::Arc;

pub use args::{Defaults, HttpArgs, OpenEndpoint, TokenizerArgs};
pub use error::{Result, TokenizerError};

use state::AppState;

/// Bind `--host:--port` and serve until SIGTERM or SIGINT.
pub fn run(args: TokenizerArgs) -> Result<()> {
    let listener =
        TcpListener::bind((args.http.host.as_str(), args.http.port)).map_err(|error| {
            TokenizerError::Io {
                what: format!("bind HTTP {}:{}", args.http.host, args.http.port),
                error,
            }
        })?;
    serve(args, listener, true, None)
}

/// Serve on an already-bound listener (tests bind port 0). With `signals`, SIGTERM/SIGINT
/// stop it; `ready` receives a handle that stops it from another thread.
pub fn serve(
    args: TokenizerArgs,
    listener: TcpListener,
    signals: bool,
    ready: Option<std::sync::mpsc::Sender<actix_web::dev::ServerHandle>>,
) -> Result<()> {
    let addr = listener.local_addr().ok();
    let tls = args.http.tls()?;
    let system = actix_rt::System::new();
    // Inside the System: the bridge starts the registry and cluster-view actors.
    let state = Arc::new(system.block_on(async { AppState::start(&args) })?);
    let bridge = state.bridge.clone();
    let stopper = state.bridge.clone();
    let result = system.block_on(async move {
        // Signals are ours, not actix's: open requests must end with an answer first.
        let scheme = if tls.is_some() { "https" } else { "http" };
        let server = http::server(state, listener, tls).map_err(|error| TokenizerError::Io {
            what: "start the HTTP server".to_string(),
            error,
        })?;
        tracing::info!(?addr, scheme, "tokenizer HTTP server listening");
        if let Some(ready) = ready {
            let _ = ready.send(server.handle());
        }
        if signals {
            let handle = server.handle();
            let bridge = stopper;
            actix_rt::spawn(async move {
                let signal = stop_signal().await;
                // Each open request ends with a 503 (a stream: an error event, then [DONE])
                // before the server stops, rather than being cut at the shutdown timeout.
                let open = bridge
                    .end_all("the tokenizer is stopping; retry the request")
                    .await;
                tracing::info!(signal, open_requests = open, "tokenizer stopping");
                handle.stop(true).await;
            });
        }
        server.await.map_err(|error| TokenizerError::Io {
            what: "HTTP server".to_string(),
            error,
        })
    });
    // The System goes first: nothing is left that could wait on the actors.
    drop(system);
    bridge.shutdown();
    result
}

/// The first SIGTERM or SIGINT, by name.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(%e, "cannot install signal handlers; stop with SIGKILL");
            std::future::pending().await
        }
    }
}

/// A server running on its own thread, for tests and embedding. Stops when dropped.
pub struct SpawnedServer {
    pub addr: std::net::SocketAddr,
    handle: actix_web::dev::ServerHandle,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl SpawnedServer {
    /// Start on `127.0.0.1:0` (a free port); returns once the server accepts connections or
    /// with the startup error.
    pub fn start(args: TokenizerArgs) -> Result<SpawnedServer> {
        let io = |what: &str| {
            let what = what.to_string();
            move |error| TokenizerError::Io { what, error }
        };
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io("bind 127.0.0.1:0"))?;
        let addr = listener
            .local_addr()
            .map_err(io("read the bound address"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("tok-http".into())
            .spawn(move || serve(args, listener, false, Some(tx)))
            .map_err(io("spawn the HTTP thread"))?;
        match rx.recv() {
            Ok(handle) => Ok(SpawnedServer {
                addr,
                handle,
                thread: Some(thread),
            }),
            Err(_) => match thread.join() {
                Ok(Err(err)) => Err(err),
                _ => Err(TokenizerError::Thread("ended at startup")),
            },
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stop gracefully and wait for the thread.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        futures::executor::block_on(self.handle.stop(false));
        thread
            .join()
            .map_err(|_| TokenizerError::Thread("panicked"))?
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}
