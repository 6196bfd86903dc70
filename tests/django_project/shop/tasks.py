from django.db import transaction
from django.tasks import task

from shop.models import Note, Order


class PaymentDeclined(Exception):
    pass


@task
def charge(order_id: int) -> dict:
    order = Order.objects.get(id=order_id)
    order.paid = True
    order.save()
    return {"charged": order.cents}


@task(queue_name="billing", priority=50)
def refund(order_id: int, reason: str = "") -> str:
    return f"refunded {order_id}: {reason}"


@task
def write_then_fail(text: str) -> None:
    Note.objects.create(text=text)  # autocommit: kept, whatever happens next
    raise PaymentDeclined(text)


@task
def write_atomically_then_fail(text: str) -> None:
    with transaction.atomic():
        Note.objects.create(text=text)  # rolled back with the block
        raise PaymentDeclined(text)


@task(takes_context=True)
def which_attempt(context) -> int:
    return context.attempt


@task
async def async_total(values: list) -> int:
    return sum(values)
