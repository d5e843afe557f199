package testenv

import "syscall"

// sysProcAttr has the kernel kill a server this package started when the
// test binary dies without its cleanup (killed by -timeout).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
