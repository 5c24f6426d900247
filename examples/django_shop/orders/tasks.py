"""The example's Django tasks: enqueue them with `.enqueue()`; `python manage.py taskq_worker` runs them."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2
    from django_tasks import task


@task(queue_name="mail", priority=10)
def send_receipt(order_id: int) -> str:
    return f"receipt for order {order_id} sent"


@task
def total(prices: list[float]) -> float:
    return round(sum(prices), 2)
