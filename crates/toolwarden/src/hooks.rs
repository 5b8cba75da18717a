//! How `[hooks]` are reached: an HTTP POST of the call as JSON, or a command given it on its
//! standard input (docs/RULES.md, "Hooks"). The engine bounds each wait; a command still running
//! when its wait ends is killed with its whole process group.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolwarden_core::backend::BoxFuture;
use toolwarden_core::hooks::{HookTarget, HookTransport};

/// The most of a hook's answer that is read.
const MAX_ANSWER: usize = 1 << 20;

/// Reaches hooks over HTTP and as commands.
pub(crate) struct HookClient {
    http: reqwest::Client,
    /// Variables a hook command must not see (the API's tokens).
    env_remove: Vec<String>,
}

impl HookClient {
    pub(crate) fn new(env_remove: Vec<String>) -> anyhow::Result<HookClient> {
        // No proxy: a hook's URL is reached as written (a proxy would take every call's
        // arguments off the machine), and no redirect either.
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        Ok(HookClient { http, env_remove })
    }
}

impl HookTransport for HookClient {
    fn ask(&self, target: &HookTarget, body: Vec<u8>) -> BoxFuture<Result<Vec<u8>, String>> {
        match target {
            HookTarget::Url(url) => {
                let request = self
                    .http
                    .post(url)
                    .header("content-type", "application/json")
                    .body(body);
                Box::pin(async move {
                    let mut response = request.send().await.map_err(|e| {
                        // The URL is the operator's (it may hold a token): never in the text.
                        if e.is_connect() {
                            "could not be reached (connection refused or no route)".to_owned()
                        } else {
                            format!("failed: {}", e.without_url())
                        }
                    })?;
                    let status = response.status();
                    if response
                        .content_length()
                        .is_some_and(|n| n > MAX_ANSWER as u64)
                    {
                        return Err(format!("answered more than {MAX_ANSWER} bytes"));
                    }
                    let mut bytes = Vec::new();
                    while let Some(chunk) = response
                        .chunk()
                        .await
                        .map_err(|e| format!("failed while answering: {}", e.without_url()))?
                    {
                        if bytes.len() + chunk.len() > MAX_ANSWER {
                            return Err(format!("answered more than {MAX_ANSWER} bytes"));
                        }
                        bytes.extend_from_slice(&chunk);
                    }
                    if !status.is_success() {
                        let shown: String =
                            String::from_utf8_lossy(&bytes).chars().take(80).collect();
                        return Err(format!("answered HTTP {status}: {shown:?}"));
                    }
                    Ok(bytes)
                })
            }
            HookTarget::Command(argv) => {
                let argv = argv.clone();
                let env_remove = self.env_remove.clone();
                Box::pin(async move { run_command(&argv, &env_remove, body).await })
            }
        }
    }
}

async fn run_command(
    argv: &[String],
    env_remove: &[String],
    body: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let (program, args) = argv.split_first().ok_or("has an empty command")?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for name in env_remove {
        cmd.env_remove(name);
    }
    // Dropped (its wait over, the call cancelled), the child's whole group is killed.
    let mut child = toolwarden_process::GroupChild::spawn(cmd)
        .map_err(|e| format!("could not start {program:?}: {e}"))?;
    let mut stdin = child.take_stdin();
    let mut stdout = child.take_stdout().ok_or("has no standard output")?;
    let mut stderr = child.take_stderr().ok_or("has no standard error")?;
    let write = async {
        if let Some(stdin) = stdin.as_mut() {
            // A hook that does not read its input still answers: a broken pipe is no error.
            let _ = stdin.write_all(&body).await;
            let _ = stdin.shutdown().await;
        }
        drop(stdin.take());
    };
    let mut out = Vec::new();
    let mut err = Vec::new();
    // Each stream is read to its end, what is past its limit thrown away: a hook that writes
    // more than that is not left blocked on a full pipe until its timeout.
    let read_out = async {
        let mut limited = (&mut stdout).take(MAX_ANSWER as u64 + 1);
        limited.read_to_end(&mut out).await?;
        tokio::io::copy(&mut stdout, &mut tokio::io::sink()).await
    };
    let read_err = async {
        let mut limited = (&mut stderr).take(4096);
        limited.read_to_end(&mut err).await?;
        tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await
    };
    let ((), read, _) = tokio::join!(write, read_out, read_err);
    read.map_err(|e| format!("could not be read: {e}"))?;
    let status = child
        .wait()
        .await
        .map_err(|e| format!("could not be waited for: {e}"))?;
    if !status.success() {
        let shown: String = String::from_utf8_lossy(&err)
            .trim()
            .chars()
            .take(200)
            .collect();
        return Err(format!("exited with {status}: {shown:?}"));
    }
    if out.len() > MAX_ANSWER {
        return Err(format!("answered more than {MAX_ANSWER} bytes"));
    }
    Ok(out)
}
