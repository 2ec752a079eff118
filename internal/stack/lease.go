package stack

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// leaseDir holds one lease file per live harness instance, in any process. The owner holds an
// exclusive flock on its lease for its whole life; a lease whose lock can be taken belongs to a
// process that died without Close, and the next harness to start tears its resources down.
const leaseDir = "/run/knext-harness"

// leaseLock serializes sweeping, creating and releasing leases.
const leaseLock = leaseDir + "/.lock"

// subnetPool is where harness bridges get their /24s: 10.240.0.0/12, 4096 subnets.
var subnetPool = net.IPNet{IP: net.IPv4(10, 240, 0, 0).To4(), Mask: net.CIDRMask(12, 32)}

// resources names everything a harness instance creates outside its process. It is the lease's
// content, so that a later harness can remove what a crashed one left behind.
type resources struct {
	ID           string `json:"id"`
	Root         string `json:"root"`
	ConfigPath   string `json:"configPath"`
	Address      string `json:"address"`
	Bridge       string `json:"bridge"`
	Network      string `json:"network"`
	Subnet       string `json:"subnet"`
	CgroupParent string `json:"cgroupParent"`
}

// lease is a held lease file.
type lease struct {
	file *os.File
}

// acquireLease sweeps leases of dead owners, then picks a fresh ID and a /24 that no live harness
// and no host route or address uses, and records the resources claim returns for them under an
// exclusive lock. Nothing is recorded if claim fails.
func acquireLease(claim func(id string, subnet *net.IPNet) (resources, error), logf func(string, ...any)) (*lease, resources, error) {
	if err := os.MkdirAll(leaseDir, 0o755); err != nil {
		return nil, resources{}, err
	}
	unlock, err := LockFile(leaseLock)
	if err != nil {
		return nil, resources{}, err
	}
	defer unlock()

	taken, err := sweepLeases(logf)
	if err != nil {
		return nil, resources{}, err
	}
	hostNets, err := hostNetworks()
	if err != nil {
		return nil, resources{}, err
	}
	subnet, err := pickSubnet(append(taken, hostNets...))
	if err != nil {
		return nil, resources{}, err
	}
	id, err := randomID()
	if err != nil {
		return nil, resources{}, err
	}
	res, err := claim(id, subnet)
	if err != nil {
		return nil, resources{}, err
	}
	data, err := json.Marshal(res)
	if err != nil {
		return nil, resources{}, err
	}
	f, err := os.OpenFile(filepath.Join(leaseDir, id+".json"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, resources{}, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, resources{}, fmt.Errorf("lock new lease %s: %w", f.Name(), err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, resources{}, err
	}
	return &lease{file: f}, res, nil
}

// release deletes the lease; call it only after its resources are gone. It takes the directory
// lock so that a concurrent sweep never sees a lease vanish between listing and locking it.
func (l *lease) release() error {
	unlock, err := LockFile(leaseLock)
	if err != nil {
		return errors.Join(err, l.file.Close())
	}
	defer unlock()
	err = os.Remove(l.file.Name())
	return errors.Join(err, l.file.Close())
}

// sweepLeases tears down the resources of every lease whose owner died and returns the subnets
// still in use: those of live leases and of stale ones whose teardown failed. A failed teardown is
// reported through logf, not returned: one broken leftover must not stop every later harness.
// The caller holds the directory lock.
func sweepLeases(logf func(string, ...any)) ([]*net.IPNet, error) {
	names, err := filepath.Glob(filepath.Join(leaseDir, "*.json"))
	if err != nil {
		return nil, err
	}
	var inUse []*net.IPNet
	for _, name := range names {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		var res resources
		decodeErr := json.NewDecoder(f).Decode(&res)
		_, subnet, subnetErr := net.ParseCIDR(res.Subnet)
		live := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil
		switch {
		case decodeErr != nil || subnetErr != nil:
			logf("harness: lease %s is unreadable, remove it and what it names by hand: %v", name, errors.Join(decodeErr, subnetErr))
		case live:
			inUse = append(inUse, subnet)
		default:
			logf("harness: removing resources of harness %s left behind by a dead process (root %s)", res.ID, res.Root)
			if err := teardown(res); err != nil {
				logf("harness: teardown of stale harness %s failed, retried by the next harness: %v", res.ID, err)
				inUse = append(inUse, subnet)
			} else if err := os.Remove(name); err != nil {
				logf("harness: %v", err)
			}
		}
		f.Close()
	}
	return inUse, nil
}

// LockFile takes an exclusive flock on name (created if missing) and returns its release.
func LockFile(name string) (func(), error) {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	return func() { f.Close() }, nil
}

// hostNetworks lists the IPv4 networks of the host's routes (all tables, default routes
// excluded) and interface addresses.
func hostNetworks() ([]*net.IPNet, error) {
	routes, err := netlinkDump("routes", func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("list host routes: %w", err)
	}
	var nets []*net.IPNet
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones > 0 {
				nets = append(nets, r.Dst)
			}
		}
	}
	addrs, err := netlinkDump("addresses", func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	for _, a := range addrs {
		nets = append(nets, a.IPNet)
	}
	return nets, nil
}

// pickSubnet returns a random /24 of subnetPool that overlaps none of used.
func pickSubnet(used []*net.IPNet) (*net.IPNet, error) {
	ones, bits := subnetPool.Mask.Size()
	count := 1 << (24 - ones)
	start, err := rand.Int(rand.Reader, big.NewInt(int64(count)))
	if err != nil {
		return nil, err
	}
	base := subnetPool.IP.To4()
	for i := range count {
		n := (int(start.Int64()) + i) % count
		candidate := &net.IPNet{
			IP:   net.IPv4(base[0], base[1]+byte(n>>8), byte(n), 0).To4(),
			Mask: net.CIDRMask(24, bits),
		}
		if !overlapsAny(candidate, used) {
			return candidate, nil
		}
	}
	return nil, fmt.Errorf("no free /24 in %s: every subnet is used by a host route, address or live harness", &subnetPool)
}

func overlapsAny(n *net.IPNet, others []*net.IPNet) bool {
	for _, o := range others {
		if o.Contains(n.IP) || n.Contains(o.IP) {
			return true
		}
	}
	return false
}

// randomID returns 8 hex digits: short enough for a 15-character interface name.
func randomID() (string, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
