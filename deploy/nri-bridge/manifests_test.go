package nribridge

import (
	"os"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/knext-dev/knext/internal/nribridge/config"
)

// The DaemonSet runs the static pod, in cluster mode: only its configuration (a ConfigMap instead
// of the node's directory), its API access (a service account token, the Node's name) and what a
// DaemonSet needs besides may differ.
func TestDaemonSetRunsTheStaticPod(t *testing.T) {
	pod, err := StaticPod()
	if err != nil {
		t.Fatal(err)
	}
	cn, err := DaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	ds := cn.DaemonSet
	if pod.Kind != "Pod" || pod.APIVersion != "v1" || ds.Kind != "DaemonSet" || ds.APIVersion != "apps/v1" {
		t.Errorf("kinds %s %s and %s %s, want v1 Pod and apps/v1 DaemonSet", pod.APIVersion, pod.Kind, ds.APIVersion, ds.Kind)
	}
	template := ds.Spec.Template.Spec.DeepCopy()
	if len(template.Tolerations) != 1 || template.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Errorf("DaemonSet tolerations %+v: want one that tolerates every taint (a node without network is tainted)", template.Tolerations)
	}
	if pod.Spec.AutomountServiceAccountToken != nil || pod.Spec.ServiceAccountName != "" {
		t.Error("the static pod names a service account: a static pod gets no token, it runs in file mode")
	}
	// Set the differences aside, then the pods must be the same.
	template.Tolerations, template.ServiceAccountName, template.AutomountServiceAccountToken = nil, "", nil
	dsContainer, podContainer := &template.Containers[0], pod.Spec.Containers[0]
	dsContainer.Env = nil
	dsVolumes := map[string]corev1.Volume{}
	for _, v := range template.Volumes {
		dsVolumes[v.Name] = v
	}
	if dsVolumes["config"].ConfigMap == nil || dsVolumes["config"].ConfigMap.Name != cn.ConfigMap.Name {
		t.Errorf("the DaemonSet's config volume %+v is not the ConfigMap %s", dsVolumes["config"], cn.ConfigMap.Name)
	}
	template.Volumes = slices.DeleteFunc(template.Volumes, func(v corev1.Volume) bool { return v.Name == "config" })
	podSpec := pod.Spec.DeepCopy()
	podSpec.Volumes = slices.DeleteFunc(podSpec.Volumes, func(v corev1.Volume) bool { return v.Name == "config" })
	if !reflect.DeepEqual(*template, *podSpec) {
		t.Errorf("the DaemonSet's pod differs from the static pod:\nDaemonSet: %+v\nstatic pod: %+v", *template, *podSpec)
	}
	if !reflect.DeepEqual(*dsContainer, podContainer) {
		t.Errorf("the DaemonSet's container differs from the static pod's:\n%+v\n%+v", *dsContainer, podContainer)
	}
	for key, value := range pod.Labels {
		if ds.Spec.Selector.MatchLabels[key] != value || ds.Spec.Template.Labels[key] != value {
			t.Errorf("label %s=%s of the static pod is not the DaemonSet's selector and template label", key, value)
		}
	}
}

// The DaemonSet runs in cluster mode: its token is mounted, of a ServiceAccount that may read
// Nodes and nothing else, and it knows its Node's name.
func TestDaemonSetRunsInClusterMode(t *testing.T) {
	cn, err := DaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	spec := cn.DaemonSet.Spec.Template.Spec
	sa := cn.ServiceAccount
	for what, namespace := range map[string]string{"ServiceAccount": sa.Namespace, "ConfigMap": cn.ConfigMap.Namespace, "DaemonSet": cn.DaemonSet.Namespace} {
		if namespace != "kube-system" {
			t.Errorf("the %s is in namespace %q, want kube-system", what, namespace)
		}
	}
	if spec.ServiceAccountName != sa.Name || spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Errorf("the DaemonSet runs as %q (token mounted: %v), want ServiceAccount %s with its token: it makes nri-bridge run in cluster mode",
			spec.ServiceAccountName, spec.AutomountServiceAccountToken, sa.Name)
	}
	wantRules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}}
	if !reflect.DeepEqual(cn.ClusterRole.Rules, wantRules) {
		t.Errorf("ClusterRole rules %+v, want exactly get, list and watch of nodes", cn.ClusterRole.Rules)
	}
	binding := cn.ClusterRoleBinding
	if binding.RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: cn.ClusterRole.Name}) ||
		!reflect.DeepEqual(binding.Subjects, []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}}) {
		t.Errorf("ClusterRoleBinding %+v does not bind ClusterRole %s to ServiceAccount %s/%s alone", binding, cn.ClusterRole.Name, sa.Namespace, sa.Name)
	}
	c := spec.Containers[0]
	if len(c.Env) != 1 || c.Env[0].Name != "NODE_NAME" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef == nil ||
		c.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("env %+v: want NODE_NAME from spec.nodeName alone (nri-bridge's -node-name)", c.Env)
	}

	// The configuration is the ConfigMap's config.yaml at the -config path, good for cluster mode.
	flags := containerFlags(t, c)
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	if dir, file := path.Split(flags["config"]); path.Clean(dir) != mounts["config"].MountPath || !mounts["config"].ReadOnly {
		t.Errorf("-config %s is not in the read-only config mount %+v", flags["config"], mounts["config"])
	} else if doc, ok := cn.ConfigMap.Data[file]; !ok {
		t.Errorf("ConfigMap %s has no %s: %v", cn.ConfigMap.Name, file, cn.ConfigMap.Data)
	} else {
		cfg, err := config.Resolve([]byte(doc), &config.Flags{})
		if err == nil {
			err = cfg.CheckCluster()
		}
		if err != nil {
			t.Errorf("the ConfigMap's %s: %v", file, err)
		}
		if cfg.StateDir != mounts["state"].MountPath {
			t.Errorf("the ConfigMap's stateDir %s is not the state mount %s", cfg.StateDir, mounts["state"].MountPath)
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
	flags := containerFlags(t, c)
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

// The DaemonSet in a release's daemonset.yaml is found again by ParseClusterNetwork, which refuses
// what nri-bridge's cluster network is not.
func TestParseClusterNetwork(t *testing.T) {
	if _, err := ParseClusterNetwork(daemonSetYAML); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ doc, want string }{
		{string(daemonSetYAML) + "\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: x}\n", "document 6: v1 Secret is not part of nri-bridge's cluster network"},
		{string(daemonSetYAML) + "\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "document 6: a second ConfigMap"},
		{strings.Replace(string(daemonSetYAML), "priorityClassName:", "priorityClass:", 1), `document 5 (DaemonSet): error unmarshaling JSON: while decoding JSON: json: unknown field "priorityClass"`},
		{string(staticPodYAML), "v1 Pod is not part of"},
	} {
		if _, err := ParseClusterNetwork([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
}

// containerFlags returns the container's arguments, -flag=value each, by flag.
func containerFlags(t *testing.T, c corev1.Container) map[string]string {
	t.Helper()
	flags := map[string]string{}
	for _, arg := range c.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(arg, "-"), "=")
		if !ok {
			t.Fatalf("argument %q: want -flag=value", arg)
		}
		flags[name] = value
	}
	return flags
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
