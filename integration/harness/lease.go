package harness

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

// subnetPool is where harness bridges get their /24s: 10.240.0.0/12, 4096 subnets.
var subnetPool = net.IPNet{IP: net.IPv4(10, 240, 0, 0).To4(), Mask: net.CIDRMask(12, 32)}

// resources names everything a harness instance creates outside its process. It is the lease's
// content, so that a later harness can remove what a crashed one left behind.
type resources struct {
	ID           string `json:"id"`
	Root         string `json:"root"`
	RemoveRoot   bool   `json:"removeRoot"`
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

// acquireLease sweeps leases of dead owners, then picks a fresh ID and a /24 no live harness and no
// host route or address uses, and records res (completed by fill) under an exclusive lock.
func acquireLease(fill func(id string, subnet *net.IPNet) resources, logf func(string, ...any)) (*lease, resources, error) {
	if err := os.MkdirAll(leaseDir, 0o755); err != nil {
		return nil, resources{}, err
	}
	unlock, err := lockFile(filepath.Join(leaseDir, ".lock"))
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
	res := fill(id, subnet)
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

// release deletes the lease; call it only after its resources are gone.
func (l *lease) release() error {
	err := os.Remove(l.file.Name())
	return errors.Join(err, l.file.Close())
}

// sweepLeases tears down the resources of every lease whose owner died and returns the subnets of
// the live ones. The caller holds the directory lock.
func sweepLeases(logf func(string, ...any)) ([]*net.IPNet, error) {
	names, err := filepath.Glob(filepath.Join(leaseDir, "*.json"))
	if err != nil {
		return nil, err
	}
	var live []*net.IPNet
	var errs []error
	for _, name := range names {
		f, err := os.Open(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var res resources
		decodeErr := json.NewDecoder(f).Decode(&res)
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if decodeErr != nil {
				errs = append(errs, fmt.Errorf("live lease %s: %w", name, decodeErr))
				continue
			}
			if _, subnet, err := net.ParseCIDR(res.Subnet); err == nil {
				live = append(live, subnet)
			}
			continue
		}
		if decodeErr != nil {
			errs = append(errs, fmt.Errorf("stale lease %s is unreadable, remove it by hand: %w", name, decodeErr))
			f.Close()
			continue
		}
		logf("harness: removing resources of harness %s left behind by a dead process (root %s)", res.ID, res.Root)
		if err := teardown(res); err != nil {
			errs = append(errs, fmt.Errorf("stale harness %s: %w", res.ID, err))
		} else if err := os.Remove(name); err != nil {
			errs = append(errs, err)
		}
		f.Close()
	}
	return live, errors.Join(errs...)
}

// lockFile takes an exclusive flock on name (created if missing) and returns its release.
func lockFile(name string) (func(), error) {
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
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
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
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
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
