#!/bin/bash
mkdir -p /app/archive
mv /app/inbox/*.log /app/archive/
