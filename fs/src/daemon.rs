//! `tierfs mount --daemon`: detach, and tell the caller whether the mount came up.
//!
//! **Fork after parsing, not re-exec.** The parent forks once the command line is parsed into a
//! [`MountRequest`]; the child serves that very value. A re-exec would have to turn the request
//! back into arguments, a second copy of the CLI definition that drifts as soon as a flag is
//! added. Forking is sound only while the process
//! has one thread (a child of a threaded process inherits locks held by threads that do not
//! exist in it): nothing starts a thread before this point (logging has none; the mount's threads
//! start in the child), and [`run`] checks it.
//!
//! **Readiness through a pipe, not polling.** The child writes one line to a pipe: `ok` once
//! the mount answers (after the FUSE handshake, exactly when a foreground mount prints
//! "mounted"), or `error: …` with the reason it could not mount, then closes its end. The
//! parent blocks in `poll` on the read end: it learns the outcome the moment it is known, and
//! end-of-file with no line means the child died before mounting (killed, or a panic); the
//! parent then reports its exit status. The pipe is close-on-exec, so `fusermount3` (run by the
//! child for an unprivileged mount) does not hold it open.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::mount::{self, MountRequest};

/// How long the parent waits for the child's answer. Mounting takes milliseconds; the FUSE
/// handshake can only hang on a broken kernel or `fusermount3`, and then the user should hear
/// about it rather than wait forever.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the mount in a detached child (a new session, so the terminal's signals do not reach it;
/// stdin and stdout on `/dev/null`, stderr to `log_file`), and returns once the mount answers,
/// or with the child's error.
pub fn run(request: &MountRequest, log_file: Option<&Path>) -> Result<()> {
    let log = match log_file {
        // 0600 when created: the log names the model files readers opened, which other users
        // of a shared mount may not be able to list.
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot open log file {}", path.display()))?,
        None => File::options()
            .write(true)
            .open("/dev/null")
            .context("cannot open /dev/null")?,
    };
    let threads = thread_count();
    if threads != 1 {
        bail!("internal error: cannot detach a process running {threads} threads");
    }
    let (read_end, write_end) = pipe().context("cannot create the daemon's status pipe")?;
    // SAFETY: the process has one thread (checked above), so the child is a complete copy.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()).context("cannot start the daemon"),
        0 => {
            drop(read_end);
            std::process::exit(child(request, &log, write_end))
        }
        pid => {
            drop(write_end);
            parent(request, pid, read_end)
        }
    }
}

/// The daemon: detaches, mounts, reports, serves until unmounted. Returns the exit code.
fn child(request: &MountRequest, log: &File, status: OwnedFd) -> i32 {
    // SAFETY: setsid and dup2 on descriptors this process owns; no memory is touched.
    unsafe {
        libc::setsid();
        if let Ok(null) = File::open("/dev/null") {
            libc::dup2(null.as_raw_fd(), libc::STDIN_FILENO);
            libc::dup2(log.as_raw_fd(), libc::STDOUT_FILENO);
        }
        libc::dup2(log.as_raw_fd(), libc::STDERR_FILENO);
    }
    let mut status = Some(File::from(status));
    let result = mount::serve(request, |mounted| {
        say!(
            "tierfs: daemon {} mounted {} at {}",
            std::process::id(),
            request.source.display(),
            mounted.mountpoint.display()
        );
        // Closing our end (dropping it) is what lets the parent's read finish.
        if let Some(mut pipe) = status.take() {
            let _ = pipe.write_all(b"ok\n");
        }
    });
    match result {
        Ok(()) => {
            say!("tierfs: unmounted {}", request.mountpoint.display());
            0
        }
        Err(e) => {
            say!("tierfs: error: {e:#}");
            if let Some(mut pipe) = status.take() {
                let _ = writeln!(pipe, "error: {e:#}");
            }
            1
        }
    }
}

/// The caller: waits for the child's line and turns it into this command's outcome.
fn parent(request: &MountRequest, pid: libc::pid_t, status: OwnedFd) -> Result<()> {
    if !wait_readable(&status, READY_TIMEOUT)? {
        bail!(
            "the mount was not ready after {} s; daemon {pid} is still running (see its log, --log-file)",
            READY_TIMEOUT.as_secs()
        );
    }
    let mut line = String::new();
    File::from(status)
        .read_to_string(&mut line)
        .context("cannot read the daemon's status")?;
    match line.trim_end() {
        "ok" => {
            say!(
                "tierfs: daemon {pid} serving {} at {}",
                request.source.display(),
                request.mountpoint.display()
            );
            Ok(())
        }
        text => match text.strip_prefix("error: ") {
            Some(reason) => bail!("{reason}"),
            None => bail!(
                "the daemon exited before the mount was ready ({}); see its log (--log-file)",
                exit_status(pid)
            ),
        },
    }
}

/// Waits until `fd` has data or end-of-file; false after `timeout`.
fn wait_readable(fd: &OwnedFd, timeout: Duration) -> Result<bool> {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    loop {
        // SAFETY: one valid pollfd.
        match unsafe { libc::poll(&mut poll, 1, millis) } {
            -1 if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            -1 => {
                return Err(std::io::Error::last_os_error()).context("cannot wait for the daemon")
            }
            0 => return Ok(false),
            _ => return Ok(true),
        }
    }
}

/// How the child ended, for the message (it has, since its end of the pipe closed unwritten).
fn exit_status(pid: libc::pid_t) -> String {
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid out-pointer.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    if waited != pid {
        "exit status unknown".into()
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit code {}", libc::WEXITSTATUS(status))
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Threads of this process (`/proc/self/task` has one entry per thread).
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, Iterator::count)
}
