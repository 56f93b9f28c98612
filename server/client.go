package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/riffle-ml/riffle/wire"
)

// Status asks the daemon at socket (DefaultSocket if empty) for its
// status: a Go client of the protocol for `riffle status`. It refuses a
// socket directory, or a daemon, that is not this user's.
func Status(ctx context.Context, socket string) (*wire.Status, error) {
	if socket == "" {
		socket = DefaultSocket()
	}
	if err := checkPrivate(filepath.Dir(socket)); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no riffle daemon at %s (its directory does not exist)", socket)
	} else if err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("no riffle daemon at %s: %w", socket, err)
	}
	defer c.Close()
	if err := peerIsMe(c.(*net.UnixConn)); err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(30 * time.Second))
	}
	r := bufio.NewReader(c)
	for i, m := range []*wire.Msg{{Op: wire.OpHello, Tag: 1, Version: wire.Version}, {Op: wire.OpStatus, Tag: 2}} {
		if err := wire.Write(c, m); err != nil {
			return nil, err
		}
		reply, err := wire.Read(r)
		if err != nil {
			return nil, err
		}
		if reply.Op == wire.OpError {
			return nil, fmt.Errorf("the daemon says: %s", reply.Message)
		}
		if i == 1 {
			return reply.Status, nil
		}
	}
	return nil, nil
}

// checkPrivate checks, without making it, that a socket's directory is
// private to this user.
func checkPrivate(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || !ok || int(sys.Uid) != os.Geteuid() || st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s: %w", dir, ErrUnsafeDir)
	}
	return nil
}

// peerIsMe checks that the process at the other end runs as this user.
func peerIsMe(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *syscall.Ucred
	var cerr error
	raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if cerr != nil {
		return cerr
	}
	if int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("the process answering runs as uid %d, not as you: %w", cred.Uid, ErrUnsafeDir)
	}
	return nil
}
