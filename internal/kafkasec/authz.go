package kafkasec

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// ACL resource types, as an AuthorizationError names them.
const (
	ResourceTopic           = "topic"
	ResourceTransactionalID = "transactional id"
	ResourceGroup           = "group"
	ResourceCluster         = "cluster"
)

// ClusterName is the name Kafka's ACLs give the cluster resource.
const ClusterName = "kafka-cluster"

// AuthorizationError says which operation on which resource Kafka's ACLs
// refused: what an operator must grant.
type AuthorizationError struct {
	// Principal is who was refused ("User:NAME"); empty when the client
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
	int16(sarama.ErrTopicAuthorizationFailed):           ResourceTopic,
	int16(sarama.ErrTransactionalIDAuthorizationFailed): ResourceTransactionalID,
	int16(sarama.ErrGroupAuthorizationFailed):           ResourceGroup,
	int16(sarama.ErrClusterAuthorizationFailed):         ResourceCluster,
}

// codeNames are the names Kafka gives the codes of refusals.
var codeNames = map[sarama.KError]string{
	sarama.ErrTopicAuthorizationFailed:           "TOPIC_AUTHORIZATION_FAILED",
	sarama.ErrTransactionalIDAuthorizationFailed: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
	sarama.ErrGroupAuthorizationFailed:           "GROUP_AUTHORIZATION_FAILED",
	sarama.ErrClusterAuthorizationFailed:         "CLUSTER_AUTHORIZATION_FAILED",
	sarama.ErrSASLAuthenticationFailed:           "SASL_AUTHENTICATION_FAILED",
}

// KafkaCode returns the Kafka error code in err's tree (a sarama KError).
func KafkaCode(err error) (int16, bool) {
	var ke sarama.KError
	if errors.As(err, &ke) {
		return int16(ke), true
	}
	return 0, false
}

// codeName is the name Kafka gives err's code (TOPIC_AUTHORIZATION_FAILED),
// or err itself.
func codeName(err error) string {
	code, ok := KafkaCode(err)
	if !ok {
		return fmt.Sprint(err)
	}
	if name, ok := codeNames[sarama.KError(code)]; ok {
		return name
	}
	return fmt.Sprintf("error code %d", code)
}

// Refused reports a refusal of a client's credentials or of one of its
// operations anywhere in err's tree: ErrRefused, an *AuthorizationError,
// or a Kafka code of SASL_AUTHENTICATION_FAILED or *_AUTHORIZATION_FAILED.
// Only an operator can fix one.
func Refused(err error) bool {
	var ae *AuthorizationError
	if errors.As(err, &ae) || errors.Is(err, ErrRefused) {
		return true
	}
	code, ok := KafkaCode(err)
	_, denied := authzCodes[code]
	return ok && (denied || code == int16(sarama.ErrSASLAuthenticationFailed))
}

// Ask is an operation a request asks for: Op on the resource of kind
// Resource named Name.
type Ask struct{ Op, Resource, Name string }

// Denied explains a refusal in err as an *AuthorizationError of
// principal: of the
// first of asks whose resource is the kind the refusal's code names (a
// request may need several grants: a producer's initialisation, Write on
// its transactional id or IdempotentWrite on the cluster). Any other err
// is returned as it is.
func Denied(err error, principal string, asks ...Ask) error {
	var ae *AuthorizationError
	if err == nil || errors.As(err, &ae) {
		return err
	}
	code, ok := KafkaCode(err)
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
		name = ClusterName
	}
	return &AuthorizationError{Principal: principal, Operation: "an operation", Resource: kind, Name: name, Err: err}
}
