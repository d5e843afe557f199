//go:build !linux

package storm

import "syscall"

// sysProcAttr: only Linux offers a parent-death signal; elsewhere children
// are stopped by the scenario's cleanup alone.
func sysProcAttr() *syscall.SysProcAttr { return nil }
