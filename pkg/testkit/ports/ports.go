// Package ports hands out loopback TCP ports for processes a test starts
// and that bind them later (a Redis, an API, a mock provider).
//
// A port the OS picked for 127.0.0.1:0 and then released lies in the
// ephemeral range, where the kernel also picks the source port of every
// outgoing connection: between the pick and the child's bind, any
// connection (to Redis, to PostgreSQL) may take it, and the child fails
// with "address already in use" (seen about once in a hundred storm
// starts). Free picks below that range, where only a listener can be.
package ports

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// floor is the lowest port handed out: above the well-known and most
// registered service ports.
const floor = 10000

// Free returns n distinct loopback ports, each free a moment ago, below
// the ephemeral range (or from the OS when that range leaves no room).
func Free(n int) ([]int, error) {
	low := ephemeralLow()
	if low-floor < 2*n {
		return fromOS(n)
	}
	var out []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	start := floor + rand.IntN(low-floor)
	for i := 0; i < low-floor && len(out) < n; i++ {
		p := floor + (start-floor+i)%(low-floor)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // taken
		}
		held = append(held, l)
		out = append(out, p)
	}
	if len(out) < n {
		return nil, fmt.Errorf("ports: only %d of %d free below %d", len(out), n, low)
	}
	return out, nil
}

// One returns one port as Free does.
func One() (int, error) {
	p, err := Free(1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux;
// 32768 elsewhere, the usual default).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	v, err := strconv.Atoi(f[0])
	if err != nil || v <= floor {
		return 32768
	}
	return v
}

// fromOS asks the OS for n ports, the fallback.
func fromOS(n int) ([]int, error) {
	var out []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, errors.Join(errors.New("ports: free port"), err)
		}
		held = append(held, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
