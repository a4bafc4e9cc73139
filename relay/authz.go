package relay

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/internal/kafkasec"
)

// ACL resource types, as an AuthorizationError names them.
const (
	ResourceTopic           = "topic"
	ResourceTransactionalID = "transactional id"
	ResourceGroup           = "group"
	ResourceCluster         = "cluster"
)

// clusterName is the name Kafka's ACLs give the cluster resource.
const clusterName = "kafka-cluster"

// AuthorizationError says which operation on which resource Kafka's ACLs
// refused: what an operator must grant. It is classified Unauthorized.
type AuthorizationError struct {
	// Principal is who was refused ("User:NAME"); empty when the relay
	// cannot tell (no SASL and no client certificate).
	Principal string
	// Operation is the ACL operation: "Write", "Read", "Describe",
	// "Create" or "IdempotentWrite".
	Operation string
	// Resource is one of the Resource constants, Name its name.
	Resource, Name string
	// Candidates, when Kafka did not say which of several resources it
	// refused (a transaction's partitions are added all at once), are
	// their names, and Name is empty.
	Candidates []string
	// Err is Kafka's refusal (an *_AUTHORIZATION_FAILED code).
	Err error
}

// Error names the principal, the operation and the resource, then
// Kafka's error code.
func (e *AuthorizationError) Error() string {
	who := e.Principal
	if who == "" {
		who = "this client's principal"
	}
	if len(e.Candidates) > 0 {
		return fmt.Sprintf("not authorized: %s lacks %s on one of the %ss %q (%s)", who, e.Operation, e.Resource,
			e.Candidates, codeName(e.Err))
	}
	return fmt.Sprintf("not authorized: %s lacks %s on %s %q (%s)", who, e.Operation, e.Resource, e.Name, codeName(e.Err))
}

// Unwrap returns Kafka's refusal.
func (e *AuthorizationError) Unwrap() error { return e.Err }

// authzCodes are the codes of refusals; SASL_AUTHENTICATION_FAILED is a
// refusal of credentials, not of an operation.
var authzCodes = map[int16]string{
	kerr.TopicAuthorizationFailed.Code:           ResourceTopic,
	kerr.TransactionalIDAuthorizationFailed.Code: ResourceTransactionalID,
	kerr.GroupAuthorizationFailed.Code:           ResourceGroup,
	kerr.ClusterAuthorizationFailed.Code:         ResourceCluster,
}

// kafkaCode returns the Kafka error code in err's tree (a sarama KError
// or a franz-go *kerr.Error).
func kafkaCode(err error) (int16, bool) {
	var ke sarama.KError
	if errors.As(err, &ke) {
		return int16(ke), true
	}
	var fe *kerr.Error
	if errors.As(err, &fe) {
		return fe.Code, true
	}
	return 0, false
}

// codeName is the name Kafka gives err's code (TOPIC_AUTHORIZATION_FAILED),
// or err itself.
func codeName(err error) string {
	code, ok := kafkaCode(err)
	if !ok {
		return fmt.Sprint(err)
	}
	var fe *kerr.Error
	if errors.As(kerr.ErrorForCode(code), &fe) {
		return fe.Message
	}
	return fmt.Sprintf("error code %d", code)
}

// isUnauthorized reports a refusal of the relay's credentials or of one of
// its operations anywhere in err's tree.
func isUnauthorized(err error) bool {
	var ae *AuthorizationError
	if errors.As(err, &ae) || errors.Is(err, kafkasec.ErrRefused) {
		return true
	}
	code, ok := kafkaCode(err)
	_, denied := authzCodes[code]
	return ok && (denied || code == kerr.SaslAuthenticationFailed.Code)
}

// ask is an operation a request asks for: Op on the resource of kind
// Resource named Name.
type ask struct{ Op, Resource, Name string }

// denied explains a refusal in err as an *AuthorizationError of
// principal: of the
// first of asks whose resource is the kind the refusal's code names (a
// request may need several grants: a producer's initialisation, Write on
// its transactional id or IdempotentWrite on the cluster). Any other err
// is returned as it is.
func denied(err error, principal string, asks ...ask) error {
	var ae *AuthorizationError
	if err == nil || errors.As(err, &ae) {
		return err
	}
	code, ok := kafkaCode(err)
	if !ok {
		return err
	}
	kind, refused := authzCodes[code]
	if !refused {
		return err
	}
	for _, a := range asks {
		if a.Resource == kind {
			return &AuthorizationError{Principal: principal, Operation: a.Op, Resource: a.Resource, Name: a.Name, Err: err}
		}
	}
	name := ""
	if kind == ResourceCluster {
		name = clusterName
	}
	return &AuthorizationError{Principal: principal, Operation: "an operation", Resource: kind, Name: name, Err: err}
}

// pinpoint finds which of the topics Kafka refused a transaction's
// records for: sarama reports a refused AddPartitionsToTxn, which covers
// every topic of the transaction, against each record alike. It asks the
// brokers which operations the principal has on each topic (metadata with
// authorized operations, Kafka 2.3 and later) and names the first that
// lacks need[topic]. err is returned unchanged when it is no refusal of a
// topic; when the brokers do not say, the error lists the topics as
// candidates.
func (k *kafka) pinpoint(ctx context.Context, err error, topics []string, need map[string]string) error {
	var ae *AuthorizationError
	if !errors.As(err, &ae) || ae.Resource != ResourceTopic {
		return err
	}
	ops, merr := k.authorizedOps(ctx, topics)
	for _, t := range topics {
		got, known := ops[t]
		if merr == nil && known && got&(1<<int32(aclOps[need[t]])) == 0 {
			return &AuthorizationError{Principal: k.principal, Operation: need[t], Resource: ResourceTopic, Name: t, Err: ae.Err}
		}
	}
	return &AuthorizationError{Principal: k.principal, Operation: ae.Operation, Resource: ResourceTopic, Candidates: topics, Err: ae.Err}
}

// aclOps are the ACL operations pinpoint checks, by the names errors give
// them.
var aclOps = map[string]kmsg.ACLOperation{"Read": kmsg.ACLOperationRead, "Write": kmsg.ACLOperationWrite}

// authorizedOps returns, per topic, the bit set of the ACL operations the
// principal has on it; a topic the brokers say nothing of is left out.
func (k *kafka) authorizedOps(ctx context.Context, topics []string) (map[string]int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	req.IncludeTopicAuthorizedOperations = true
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, k.cl)
	if err != nil {
		return nil, err
	}
	ops := map[string]int32{}
	for _, t := range resp.Topics {
		// Kafka sends INT32_MIN when it was not asked or cannot say.
		if t.Topic != nil && t.AuthorizedOperations != math.MinInt32 {
			ops[*t.Topic] = t.AuthorizedOperations
		}
	}
	return ops, nil
}
