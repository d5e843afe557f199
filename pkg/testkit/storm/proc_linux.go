package storm

import "syscall"

// sysProcAttr has the kernel kill a child when the benchmark process dies
// without stopping it (a test binary killed by -timeout runs no cleanup).
// The signal follows the thread that started the child; a Go runtime
// thread only ends when a goroutine locked to it exits, which this package
// never does, so in practice it fires when the process itself is gone.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
