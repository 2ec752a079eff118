package cluster

import (
	"context"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	nribridge "github.com/knext-dev/knext/deploy/nri-bridge"
)

// coreDNSManifest is the cluster DNS as Kubernetes deploys it (its RBAC, Corefile, Deployment and
// the kube-dns Service at the kubelets' clusterDNS), with two differences: no `forward` (no
// resolver outside the cluster is reachable, and none may be asked) and the image from a local
// archive. IMAGE, DNS4 and DNS6 are filled in.
const coreDNSManifest = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
    .:53 {
        errors
        health {
            lameduck 5s
        }
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            ttl 30
        }
        prometheus :9153
        cache 30
        loop
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  replicas: 2
  selector:
    matchLabels:
      k8s-app: kube-dns
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              topologyKey: kubernetes.io/hostname
              labelSelector:
                matchLabels:
                  k8s-app: kube-dns
      containers:
      - name: coredns
        image: IMAGE
        imagePullPolicy: IfNotPresent
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        - {name: metrics, containerPort: 9153, protocol: TCP}
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 10
          periodSeconds: 10
          failureThreshold: 5
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 2
        volumeMounts:
        - name: config
          mountPath: /etc/coredns
          readOnly: true
      volumes:
      - name: config
        configMap:
          name: coredns
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  selector:
    k8s-app: kube-dns
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: DNS4
  clusterIPs: [DNS4, DNS6]
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
`

// applyAddons applies CoreDNS.
func (c *Cluster) applyAddons(ctx context.Context) error {
	manifest := strings.NewReplacer("IMAGE", c.CoreDNSImage, "DNS4", dnsServiceIPs[0], "DNS6", dnsServiceIPs[1]).Replace(coreDNSManifest)
	if _, err := c.Kubectl(ctx, []byte(manifest), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("apply CoreDNS: %w", err)
	}
	return nil
}

// NRIBridgeManifest returns deploy/nri-bridge/daemonset.yaml as shipped, with the cluster's
// nri-bridge image in place of the placeholder.
func (c *Cluster) NRIBridgeManifest() ([]byte, error) {
	data, err := os.ReadFile(c.NRIBridge)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(string(data), nribridge.ImagePlaceholder) {
		return nil, fmt.Errorf("%s: no image %s to set", c.NRIBridge, nribridge.ImagePlaceholder)
	}
	return []byte(strings.ReplaceAll(string(data), nribridge.ImagePlaceholder, c.NRIBridgeImage)), nil
}

// ApplyNRIBridge applies nri-bridge's DaemonSet (`kubectl apply`), the nodes' pod network in
// knext mode.
func (c *Cluster) ApplyNRIBridge(ctx context.Context) error {
	manifest, err := c.NRIBridgeManifest()
	if err != nil {
		return err
	}
	c.logf("cluster %s: applying %s (image %s)", c.ID, c.NRIBridge, c.NRIBridgeImage)
	if _, err := c.Kubectl(ctx, manifest, "apply", "-f", "-"); err != nil {
		return fmt.Errorf("apply nri-bridge: %w", err)
	}
	return nil
}

// nodesReady checks that want nodes are registered, Ready, and without the taint of a node not
// ready or unreachable: the controller-manager removes it only once it has seen the node Ready,
// and until then the scheduler keeps new pods off the node.
func nodesReady(ctx context.Context, client kubernetes.Interface, want int) error {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if len(nodes.Items) != want {
		return fmt.Errorf("%d nodes registered, want %d", len(nodes.Items), want)
	}
	for _, node := range nodes.Items {
		if cond := NodeCondition(&node, corev1.NodeReady); cond == nil || cond.Status != corev1.ConditionTrue {
			msg := "no Ready condition yet"
			if cond != nil {
				msg = cond.Reason + ": " + cond.Message
			}
			return fmt.Errorf("node %s is not Ready: %s", node.Name, msg)
		}
		for _, t := range node.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
				return fmt.Errorf("node %s is Ready but still tainted %s", node.Name, t.Key)
			}
		}
	}
	return nil
}

// NodeCondition returns node's condition of type t, or nil.
func NodeCondition(node *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == t {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// DeploymentReady checks that the Deployment's rollout is complete: every replica updated and
// available, and no replica of an older template left.
func DeploymentReady(ctx context.Context, client kubernetes.Interface, namespace, name string) error {
	d, err := client.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if st := d.Status; st.ObservedGeneration < d.Generation || st.UpdatedReplicas != want || st.AvailableReplicas != want || st.Replicas != want {
		return fmt.Errorf("deployment %s/%s: %d of %d replicas updated, %d available, %d in all", namespace, name,
			st.UpdatedReplicas, want, st.AvailableReplicas, st.Replicas)
	}
	return nil
}

// PodReady tells whether pod's Ready condition is true.
func PodReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
