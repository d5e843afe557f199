//go:build !unix

package storm

import "syscall"

// pgOwner: outside Unix the PostgreSQL programs run as the current user.
type pgOwner struct {
	root     bool
	uid, gid uint32
}

func pgOwnerOf() (pgOwner, error) { return pgOwner{}, nil }

func (o pgOwner) attr() *syscall.SysProcAttr { return sysProcAttr() }
