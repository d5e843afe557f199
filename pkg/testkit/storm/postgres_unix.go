//go:build unix

package storm

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// pgOwner is the user the PostgreSQL programs run as: the current one,
// or — as root, which PostgreSQL refuses to run as — user postgres, as
// scripts/services.sh does with runuser.
type pgOwner struct {
	root     bool
	uid, gid uint32
}

func pgOwnerOf() (pgOwner, error) {
	if os.Geteuid() != 0 {
		return pgOwner{}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return pgOwner{}, fmt.Errorf("%w: %v", errNoPostgresUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return pgOwner{}, fmt.Errorf("storm: user postgres: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return pgOwner{}, fmt.Errorf("storm: user postgres: gid %q: %w", u.Gid, err)
	}
	return pgOwner{root: true, uid: uint32(uid), gid: uint32(gid)}, nil
}

// attr are the attributes of a child run as the owner. The credentials
// are set directly rather than through runuser so that the server is the
// child itself: the signals sent to stop it reach it, and the
// parent-death signal (set after the switch of user) still kills it if
// the test process dies.
func (o pgOwner) attr() *syscall.SysProcAttr {
	a := sysProcAttr()
	if !o.root {
		return a
	}
	if a == nil {
		a = &syscall.SysProcAttr{}
	}
	a.Credential = &syscall.Credential{Uid: o.uid, Gid: o.gid}
	return a
}
