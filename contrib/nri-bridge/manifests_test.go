package nribridge

import (
	"os"
	"path"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The DaemonSet runs the static pod: only what a DaemonSet needs besides may differ.
func TestDaemonSetRunsTheStaticPod(t *testing.T) {
	pod, err := StaticPod()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := DaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	if pod.Kind != "Pod" || pod.APIVersion != "v1" || ds.Kind != "DaemonSet" || ds.APIVersion != "apps/v1" {
		t.Errorf("kinds %s %s and %s %s, want v1 Pod and apps/v1 DaemonSet", pod.APIVersion, pod.Kind, ds.APIVersion, ds.Kind)
	}
	template := ds.Spec.Template.Spec.DeepCopy()
	if template.AutomountServiceAccountToken == nil || *template.AutomountServiceAccountToken {
		t.Error("the DaemonSet mounts a service account token: nri-bridge never talks to the API server")
	}
	if len(template.Tolerations) != 1 || template.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Errorf("DaemonSet tolerations %+v: want one that tolerates every taint (a node without network is tainted)", template.Tolerations)
	}
	template.AutomountServiceAccountToken, template.Tolerations = nil, nil
	if !reflect.DeepEqual(*template, pod.Spec) {
		t.Errorf("the DaemonSet's pod differs from the static pod:\nDaemonSet: %+v\nstatic pod: %+v", *template, pod.Spec)
	}
	for key, value := range pod.Labels {
		if ds.Spec.Selector.MatchLabels[key] != value || ds.Spec.Template.Labels[key] != value {
			t.Errorf("label %s=%s of the static pod is not the DaemonSet's selector and template label", key, value)
		}
	}
}

// The static pod mounts every host path nri-bridge uses with its configuration, as it uses it.
func TestStaticPodMountsWhatNRIBridgeUses(t *testing.T) {
	pod, err := StaticPod()
	if err != nil {
		t.Fatal(err)
	}
	if !pod.Spec.HostNetwork {
		t.Error("not on the host network: the pod could not start before the pod network it provides")
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want nri-bridge alone", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if c.Image != ImagePlaceholder || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("image %s (pull policy %s), want %s, never pulled", c.Image, c.ImagePullPolicy, ImagePlaceholder)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("not privileged: nri-bridge creates links and enters pod network namespaces")
	}
	volumes := map[string]*corev1.HostPathVolumeSource{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v.HostPath
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
		if hostPath := volumes[m.Name]; hostPath == nil || hostPath.Path != m.MountPath {
			t.Errorf("mount %s at %s is not the host path of the same name (%+v): nri-bridge and containerd must agree on paths", m.Name, m.MountPath, hostPath)
		}
	}
	flags := map[string]string{}
	for _, arg := range c.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(arg, "-"), "=")
		if !ok {
			t.Fatalf("argument %q: want -flag=value", arg)
		}
		flags[name] = value
	}
	stateDir := mounts["state"].MountPath
	for _, want := range []struct{ what, path, mount string }{
		{"the NRI socket", flags["nri-socket"], "nri"},
		{"the configuration", flags["config"], "config"},
		{"the state directory of bridge.conf", path.Join(configStateDir(t), "allocations.db"), "state"},
	} {
		if m, ok := mounts[want.mount]; !ok || path.Dir(want.path) != m.MountPath {
			t.Errorf("%s %s is not in the mount %s (%+v)", want.what, want.path, want.mount, m)
		}
	}
	if stateDir != "/var/lib/nri-bridge" || *volumes["state"].Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("state mount %s (%v), want nri-bridge's default /var/lib/nri-bridge, created if missing", stateDir, *volumes["state"].Type)
	}
	if socketDir := volumes["nri"]; socketDir == nil || *socketDir.Type != corev1.HostPathDirectory {
		t.Error("the NRI socket is not mounted as its directory: a restarted containerd's new socket would not be seen")
	}
	if !mounts["config"].ReadOnly {
		t.Error("the configuration is mounted writable")
	}
	netns := mounts["netns"]
	if netns.MountPath != "/var/run/netns" || netns.MountPropagation == nil || *netns.MountPropagation != corev1.MountPropagationHostToContainer {
		t.Errorf("netns mount %+v: want containerd's /var/run/netns with HostToContainer propagation (namespaces appear after the plugin starts)", netns)
	}
}

// configStateDir returns the stateDir of the example configuration.
func configStateDir(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("bridge.conf")
	if err != nil {
		t.Fatal(err)
	}
	var config struct {
		StateDir string `json:"stateDir"`
	}
	if err := yaml.Unmarshal(data, &config); err != nil || config.StateDir == "" {
		t.Fatalf("bridge.conf: stateDir %q: %v", config.StateDir, err)
	}
	return config.StateDir
}
