//! `GET /metrics` over plain HTTP: the Prometheus text exposition of a node (every
//! group of every mode, plus the control plane's on a control node) or of a file-system
//! mount. A deliberately small HTTP/1.1 responder: one request per connection, bounded
//! reads and time.

use std::sync::Arc;
use std::time::Duration;

use chorus_runtime::Env;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Renders an exposition (called off the runtime's threads).
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// More metrics rendered after the environment's (the control plane's on a control
/// node).
pub type ExtraMetrics = Render;

/// Serves `GET /metrics` for `env` on `listener` until the process ends.
pub async fn serve_metrics(env: Env, listener: tokio::net::TcpListener) {
    serve_metrics_with(env, listener, None).await
}

/// [`serve_metrics`], with `extra` appended to every exposition.
pub async fn serve_metrics_with(
    env: Env,
    listener: tokio::net::TcpListener,
    extra: Option<ExtraMetrics>,
) {
    // Every group of every mode, in one exposition; out-of-order groups answer through
    // their drivers, so not on this runtime's threads.
    let render: Render = Arc::new(move || {
        let mut b = env.render_metrics();
        if let Some(f) = &extra {
            b.push_str(&f());
        }
        b
    });
    serve_text(listener, render).await
}

/// Serves `GET /metrics` with what `render` gives, on `listener`, until the process
/// ends.
pub async fn serve_text(listener: tokio::net::TcpListener, render: Render) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let render = render.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut n = 0;
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    let k = sock.read(&mut buf[n..]).await?;
                    if k == 0 {
                        break;
                    }
                    n += k;
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") || n == buf.len() {
                        break;
                    }
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                return;
            }
            let req = String::from_utf8_lossy(&buf[..n]);
            let (code, body, ctype) = if req.starts_with("GET /metrics ") {
                let body = tokio::task::spawn_blocking(move || render())
                    .await
                    .unwrap_or_default();
                ("200 OK", body, "text/plain; version=0.0.4")
            } else {
                (
                    "404 Not Found",
                    "try GET /metrics\n".to_string(),
                    "text/plain",
                )
            };
            let resp = format!(
                "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}
