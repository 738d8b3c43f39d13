"""Storage for definitions, runs, step executions and the event timeline.

Models hold no workflow rules: those live in ``queuety.core``; ``queuety.runtime`` and the use
cases above it (``dispatch``, ``inbox``, ``operations``, ...) move data between the two.
"""

from __future__ import annotations

# The core's status vocabulary, re-exported: the storage speaks the same words (and its
# ``choices`` are labelled as ``TextChoices`` would label them, so no migration changes).
from queuety.core.status import RunStatus as RunStatus
from queuety.core.status import StepStatus as StepStatus
from queuety.models.bulk import (
    BulkOperation as BulkOperation,
)
from queuety.models.jobs import (
    JOB_PREFIX as JOB_PREFIX,
)
from queuety.models.jobs import (
    UNIQUE_KEY_PREFIX as UNIQUE_KEY_PREFIX,
)
from queuety.models.jobs import (
    Job as Job,
)
from queuety.models.jobs import (
    JobManager as JobManager,
)
from queuety.models.outputs import (
    AgentCheckpoint as AgentCheckpoint,
)
from queuety.models.outputs import (
    Artifact as Artifact,
)
from queuety.models.outputs import (
    StepChunk as StepChunk,
)
from queuety.models.resources import (
    GroupLease as GroupLease,
)
from queuety.models.resources import (
    GroupStart as GroupStart,
)
from queuety.models.resources import (
    QueuePause as QueuePause,
)
from queuety.models.resources import (
    ResourceGroup as ResourceGroup,
)
from queuety.models.runs import (
    ERROR_TYPE as ERROR_TYPE,
)
from queuety.models.runs import (
    ApiReply as ApiReply,
)
from queuety.models.runs import (
    DispatchKey as DispatchKey,
)
from queuety.models.runs import (
    Event as Event,
)
from queuety.models.runs import (
    Signal as Signal,
)
from queuety.models.runs import (
    StepRun as StepRun,
)
from queuety.models.runs import (
    TagsIndex as TagsIndex,
)
from queuety.models.runs import (
    WorkflowDefinition as WorkflowDefinition,
)
from queuety.models.runs import (
    WorkflowDependency as WorkflowDependency,
)
from queuety.models.runs import (
    WorkflowRun as WorkflowRun,
)
from queuety.models.webhooks import (
    InboundDelivery as InboundDelivery,
)
from queuety.models.webhooks import (
    WebhookDelivery as WebhookDelivery,
)
from queuety.models.webhooks import (
    WebhookEndpoint as WebhookEndpoint,
)
from queuety.models.workers import (
    SweepLease as SweepLease,
)
from queuety.models.workers import (
    Worker as Worker,
)
