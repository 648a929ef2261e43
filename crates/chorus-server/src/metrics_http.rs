//! `GET /metrics` over plain HTTP: the Prometheus text exposition of a node (every
//! group of every mode, plus the control plane's on a control node) or of a file-system
//! mount; on a node also its status page, `GET /` (or `/status`) and `GET /status.json`
//! ([`crate::status_page`]). Any other path is 404. A deliberately small HTTP/1.1
//! responder: one request per connection, bounded reads and time.

use std::sync::Arc;
use std::time::Duration;

use chorus_runtime::Env;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::status_page::StatusPage;

/// Renders an exposition (called off the runtime's threads).
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// More metrics rendered after the environment's (the control plane's on a control
/// node).
pub type ExtraMetrics = Render;

/// Serves `GET /metrics` and the status page for `env` on `listener` until the process
/// ends.
pub async fn serve_metrics(env: Env, listener: tokio::net::TcpListener) {
    serve_metrics_with(env, listener, None).await
}

/// [`serve_metrics`], with `extra` appended to every exposition. Starts the status page's
/// sampler ([`StatusPage::start`]) on the current Tokio runtime.
pub async fn serve_metrics_with(
    env: Env,
    listener: tokio::net::TcpListener,
    extra: Option<ExtraMetrics>,
) {
    // Every group of every mode, in one exposition; out-of-order groups answer through
    // their drivers, so not on this runtime's threads.
    let of = env.clone();
    let render: Render = Arc::new(move || {
        let mut b = of.render_metrics();
        if let Some(f) = &extra {
            b.push_str(&f());
        }
        b
    });
    let page = StatusPage::start(env, render.clone());
    serve(listener, render, Some(page)).await
}

/// Serves `GET /metrics` with what `render` gives, on `listener`, until the process
/// ends.
pub async fn serve_text(listener: tokio::net::TcpListener, render: Render) {
    serve(listener, render, None).await
}

/// The request target of `GET <target> HTTP/1.x`, without its query string; `None` for
/// another method.
fn get_path(req: &str) -> Option<&str> {
    let line = req.lines().next()?;
    let target = line.strip_prefix("GET ")?.split(' ').next()?;
    target.split('?').next()
}

/// Serves `GET /metrics` with what `render` gives, and with `page` the status page, on
/// `listener` until the process ends.
async fn serve(listener: tokio::net::TcpListener, render: Render, page: Option<Arc<StatusPage>>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let render = render.clone();
        let page = page.clone();
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
            let (code, body, ctype) = match (get_path(&req), &page) {
                (Some("/metrics"), _) => {
                    let body = tokio::task::spawn_blocking(move || render())
                        .await
                        .unwrap_or_default();
                    ("200 OK", body, "text/plain; version=0.0.4")
                }
                (Some("/" | "/status"), Some(_)) => (
                    "200 OK",
                    crate::status_page::PAGE.to_string(),
                    "text/html; charset=utf-8",
                ),
                (Some("/status.json"), Some(p)) => {
                    let p = p.clone();
                    match tokio::task::spawn_blocking(move || p.status_json()).await {
                        Ok(body) => ("200 OK", body, "application/json"),
                        Err(_) => (
                            "500 Internal Server Error",
                            "status unavailable\n".to_string(),
                            "text/plain",
                        ),
                    }
                }
                (_, page) => (
                    "404 Not Found",
                    if page.is_some() {
                        "try GET /metrics, GET / (the status page) or GET /status.json\n"
                    } else {
                        "try GET /metrics\n"
                    }
                    .to_string(),
                    "text/plain",
                ),
            };
            let resp = format!(
                "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::get_path;

    #[test]
    fn the_path_is_the_get_target_without_its_query() {
        assert_eq!(
            get_path("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some("/metrics")
        );
        assert_eq!(
            get_path("GET /status.json?t=1 HTTP/1.1\r\n"),
            Some("/status.json")
        );
        assert_eq!(get_path("GET / HTTP/1.0\r\n"), Some("/"));
        assert_eq!(get_path("POST /metrics HTTP/1.1\r\n"), None);
        assert_eq!(get_path(""), None);
    }
}
